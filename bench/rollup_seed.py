"""The store `bench.rollup` measures: accepted batches of synthetic agents written as a
collector writes them, cataloged, with their work markers (restored between rounds)."""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from bench.rollup_cluster import catalog
from protocol import keys
from protocol.frame_encode import encode_frame
from protocol.records import AcceptedManifest

NS_PER_S = keys.NS_PER_S

_LABELS = pa.map_(pa.string(), pa.string())
_POINTS_FRAME_SCHEMA = pa.schema(
    [
        pa.field("ts", pa.timestamp("ns", tz="UTC")),
        pa.field("metric", pa.string()),
        pa.field("value", pa.float64()),
        pa.field("labels", _LABELS),
    ]
)


# --- dataset --------------------------------------------------------------------------------


def agent_series(agent: int) -> tuple[pa.Array, pa.Array, np.ndarray, np.ndarray]:
    """(metric, labels, low, high) of one agent's 15 series."""
    base = {"host": f"host-{agent:04d}", "region": ("us-east-1", "eu-west-1")[agent % 2]}
    series: list[tuple[str, dict[str, str], float, float]] = [
        ("cpu_usage_percent", {**base, "cpu": str(c)}, 0.0, 100.0) for c in range(4)
    ]
    series.append(("memory_used_bytes", dict(base), 2e8, 8e9))
    series += [
        ("http_requests_total", {**base, "method": m, "status": s}, 0.0, 50.0)
        for m in ("GET", "POST", "PUT")
        for s in ("200", "404", "500")
    ]
    series.append(("disk_written_bytes_total", {**base, "device": "sda"}, 0.0, 1e7))
    return (
        pa.array([s[0] for s in series]),
        pa.array([list(s[1].items()) for s in series], _LABELS),
        np.array([s[2] for s in series]),
        np.array([s[3] for s in series]),
    )


def seed_store(
    root: Path, *, points: int, agents: int, per_frame: int, data_hours: int, seed: int
) -> dict[str, Any]:
    """Write accepted batches under ``root`` (the fs store layout: object K = file root/K)."""
    rng = np.random.default_rng(seed)
    per_agent = points // agents
    frames_per_agent = max(1, per_agent // per_frame)
    interval_ns = data_hours * 3600 * NS_PER_S // per_agent
    start_ns = keys.UtcHour.parse_iso("2026-11-21T00").start_ns
    accepted_at = time.time_ns()
    total_points = 0
    total_bytes = 0
    for agent in range(agents):
        metric, labels, low, high = agent_series(agent)
        boot = uuid.UUID(int=agent + 1, version=4)
        agent_id = f"bench-agent-{agent:04d}"
        for batch in range(frames_per_agent):
            first = batch * per_frame
            count = per_frame if batch < frames_per_agent - 1 else per_agent - first
            pick = rng.integers(0, len(low), count)
            ts = start_ns + agent * 1_000_000 + (first + np.arange(count)) * interval_ns
            values = np.round(rng.uniform(low[pick], high[pick]), 3)
            table = pa.Table.from_arrays(
                [
                    pa.array(ts, pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
                    metric.take(pick),
                    pa.array(values),
                    labels.take(pick),
                ],
                schema=_POINTS_FRAME_SCHEMA,
            )
            frame = encode_frame(agent_id=agent_id, boot_id=boot, seq_start=first, points=table)
            manifest = AcceptedManifest.of_frame(
                frame, accepted_at_unix_ns=accepted_at, collector_id="bench"
            )
            objects = [(manifest.raw_blob_key, frame), (manifest.manifest_key, manifest.to_json())]
            for key, body in objects:
                path = root / key
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(body)
            total_points += count
            total_bytes += len(frame)
    catalog_store(root)
    return {
        "points": total_points,
        "frames": agents * frames_per_agent,
        "frame_bytes": total_bytes,
        "series": agents * 15,
    }


def catalog_store(root: Path) -> None:
    """Catalog the batches as production does: ``lm-reconciler run --once`` (its first
    pass audits the store: catalog files and the rollup's work markers), then keep a copy
    of the markers, which every timed run consumes (`restore_markers`)."""
    config = root.parent / f"{root.name}-reconciler.toml"
    config.write_text(
        f'[store]\nurl = "file://{root}"\n[gc]\nenabled = false\n[logging]\nlevel = "warning"\n'
    )
    catalog(config)
    saved = root.parent / f"{root.name}-markers"
    shutil.copytree(root / keys.ROLLUP_WORK_PREFIX, saved / keys.ROLLUP_WORK_PREFIX)


def restore_markers(store_dir: Path) -> None:
    """Nothing rolled up, every batch pending again: no ``rollup/``, the work markers back."""
    shutil.rmtree(store_dir / "rollup", ignore_errors=True)
    saved = store_dir.parent / f"{store_dir.name}-markers" / keys.ROLLUP_WORK_PREFIX
    shutil.rmtree(store_dir / keys.ROLLUP_WORK_PREFIX, ignore_errors=True)
    shutil.copytree(saved, store_dir / keys.ROLLUP_WORK_PREFIX)


# --- the two contestants (each runs in a child process) ------------------------------------
