"""The rollup's throughput on a Spark standalone cluster, beside Spark local mode.

    .venv/bin/python -m bench.rollup_cluster                     # 1M points, 2 rounds
    .venv/bin/python -m bench.rollup_cluster --points 200000 --rounds 1

One MiniStack holds the store (S3 is all a cluster's executors share with the driver).
It is seeded once with ``--points`` points in accepted batches of ``--points-per-frame``
from ``--agents`` agents (15 series each, timestamps over two hours), stored as the
collector stores them (raw blob, manifest) and cataloged by ``lm-reconciler run --once``
(its first pass audits the bucket: catalog files and rollup work markers). Then,
alternating, ``--rounds`` times each:

- **cluster**: ``spark-submit --master spark://127.0.0.1:P`` to a master and two 1-core,
  1 GiB workers (`chaos.spark_standalone`, separate JVMs), the project shipped as the
  `rollup.job.pyfiles` zip;
- **local**: the same ``spark-submit`` command with ``--master local[2]`` (one JVM).

Before each run the dataset is made pending again (``rollup/v1/`` deleted, the work
markers put back). Reported per run: wall seconds of the whole ``spark-submit`` (JVM,
executors, Python workers, job), the job's own seconds from its run summary (plan +
stages + commit) and points/s over those, CPU seconds (in all, and by role:
`bench.cpu_by_role`) and the cores other users took meanwhile. Benchmarks are not
tests: nothing in ``tests/`` imports this.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from bench._common import busy_cpu_seconds
from bench.cpu_by_role import CpuByRole
from chaos.s3_server import (
    child_env,
    fresh_bucket,
    start_ministack,
    use_dummy_aws_credentials,
)
from chaos.spark_standalone import spark_submit, start_cluster
from protocol import keys
from protocol.frame_encode import encode_frame
from protocol.records import AcceptedManifest
from rollup.job.pyfiles import build_pyfiles
from store.base import ObjectStore
from store.open import open_store

T = TypeVar("T")
NS_PER_S = 1_000_000_000
DATA_START_NS = keys.UtcHour.parse_iso("2026-11-21T10").start_ns
_FRAME_SCHEMA = pa.schema(
    [
        pa.field("ts", pa.timestamp("ns", tz="UTC")),
        pa.field("metric", pa.string()),
        pa.field("value", pa.float64()),
        pa.field("labels", pa.map_(pa.string(), pa.string())),
    ]
)
_METRICS = ["cpu", "cpu", "cpu", "cpu", "mem", *["http_requests"] * 9, "disk"]


def _frame(agent: int, first: int, count: int, per_agent: int, rng: Any) -> bytes:
    series = rng.integers(0, len(_METRICS), count)
    interval = 2 * 3600 * NS_PER_S // per_agent
    ts = DATA_START_NS + agent * 1_000_000 + (first + np.arange(count)) * interval
    labels = pa.array(
        [[("host", f"h{agent}"), ("s", str(s))] for s in range(len(_METRICS))],
        pa.map_(pa.string(), pa.string()),
    )
    table = pa.Table.from_arrays(
        [
            pa.array(ts, pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
            pa.array(_METRICS).take(pa.array(series)),
            pa.array(np.round(rng.uniform(0, 100, count), 3)),
            labels.take(pa.array(series)),
        ],
        schema=_FRAME_SCHEMA,
    )
    boot = uuid.UUID(int=agent + 1, version=4)
    return encode_frame(agent_id=f"agent-{agent:04d}", boot_id=boot, seq_start=first, points=table)


async def seed(store: ObjectStore, *, points: int, agents: int, per_frame: int) -> int:
    """Accepted batches as the collector stores them (raw blob, then manifest); returns
    the points stored. `catalog` makes them the rollup's work."""
    rng = np.random.default_rng(1)
    per_agent = points // agents
    manifests = []
    limit = asyncio.Semaphore(16)  # bounded: at most 16 PUTs in flight

    async def put(key: str, body: bytes) -> None:
        async with limit:
            await store.put(key, body)

    for agent in range(agents):
        tasks = []
        for first in range(0, per_agent, per_frame):
            count = min(per_frame, per_agent - first)
            frame = _frame(agent, first, count, per_agent, rng)
            manifest = AcceptedManifest.of_frame(
                frame, accepted_at_unix_ns=time.time_ns(), collector_id="bench"
            )
            manifests.append(manifest)
            tasks += [
                put(manifest.raw_blob_key, frame),
                put(manifest.manifest_key, manifest.to_json()),
            ]
        await asyncio.gather(*tasks)
    return sum(m.record_count for m in manifests)


def catalog(config: Path) -> None:
    """``lm-reconciler run --once``: its first pass audits the bucket and catalogs every
    accepted batch, writing the catalog files and the rollup work markers."""
    subprocess.run(
        [sys.executable, "-m", "reconciler", "--config", str(config), "run", "--once"],
        env=child_env(),
        stdout=subprocess.DEVNULL,
        check=True,
        timeout=600,
    )


async def _list(store: ObjectStore, prefix: str) -> list[str]:
    return [info.key async for info in store.list(prefix)]


async def saved_markers(store: ObjectStore) -> list[tuple[str, bytes]]:
    return [
        (key, (await store.get(key))[0]) for key in await _list(store, keys.ROLLUP_DIRTY_PREFIX)
    ]


async def make_pending(store: ObjectStore, markers: list[tuple[str, bytes]]) -> None:
    for key in await _list(store, keys.ROLLUP_PREFIX):
        await store.delete(key)
    for key, body in markers:
        await store.put(key, body)


def run_once(
    master: str, work_dir: Path, zip_path: Path, entry: Path, config: Path
) -> dict[str, Any]:
    load_before = os.getloadavg()
    by_role = CpuByRole(os.getpid()).start()
    busy_before = busy_cpu_seconds()
    started = time.monotonic()
    completed = spark_submit(
        master,
        work_dir,
        ["--py-files", str(zip_path), str(entry), "--config", str(config), "run"],
        timeout_s=1800,
    )
    wall = time.monotonic() - started
    cpu_by_role = by_role.stop()
    ours = sum(cpu_by_role.values())
    others_cores = max(0.0, busy_cpu_seconds() - busy_before - ours) / wall
    if completed.returncode != 0:
        raise RuntimeError(f"{master}: exit {completed.returncode}\n{completed.stdout[-3000:]}")
    lines = completed.stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    summary = json.loads("\n".join(lines[start : lines.index("}", start) + 1]))
    job = sum(summary["seconds"].values())
    return {
        "master": master,
        "points": summary["points"],
        "wall_s": round(wall, 2),
        "job_s": round(job, 2),
        "seconds": summary["seconds"],
        "points_per_s": round(summary["points"] / job),
        "cpu_s": round(ours, 1),
        "cpu_s_by_role": cpu_by_role,
        "others_cores": round(others_cores, 2),
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rollup_cluster")
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--agents", type=int, default=20)
    parser.add_argument("--points-per-frame", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    use_dummy_aws_credentials()

    with tempfile.TemporaryDirectory(prefix="lm-bench-cluster-") as temp:
        root = Path(temp)
        server = start_ministack(root / "ministack")
        cluster = None
        try:
            bucket = fresh_bucket(server)
            url = f"s3://{bucket}/lm"
            config = root / "rollup.toml"
            config.write_text(
                f'[store]\nurl = "{url}"\nendpoint_url = "{server.endpoint_url}"\n\n'
                '[rollup]\nowner_lease_ttl_s = 120.0\n\n[logging]\nformat = "json"\n'
            )

            async def with_store(action: Callable[[ObjectStore], Awaitable[T]]) -> T:
                store = open_store(url, endpoint_url=server.endpoint_url)
                try:
                    return await action(store)
                finally:
                    await store.close()

            seeding = time.monotonic()
            points = asyncio.run(
                with_store(
                    lambda store: seed(
                        store,
                        points=args.points,
                        agents=args.agents,
                        per_frame=args.points_per_frame,
                    )
                )
            )
            catalog(config)
            markers = asyncio.run(with_store(saved_markers))
            print(
                f"seeded and cataloged {points} points in {time.monotonic() - seeding:.1f}s "
                f"({len(markers)} work markers)",
                flush=True,
            )
            built = build_pyfiles(root / "dist")
            cluster = start_cluster(root / "cluster")
            results: list[dict[str, Any]] = []
            for round_ in range(args.rounds):
                for master in (cluster.master_url, "local[2]"):
                    asyncio.run(with_store(lambda store: make_pending(store, markers)))
                    result = run_once(
                        master, root / f"run-{round_}-{len(results)}", built.zip_path,
                        built.entry_path, config,
                    )  # fmt: skip
                    results.append(result)
                    print(json.dumps(result), flush=True)
        finally:
            if cluster is not None:
                cluster.stop()
            server.stop()

    for kind in ("spark://", "local"):
        runs = [r for r in results if r["master"].startswith(kind)]
        print(
            f"{kind:9} median job {statistics.median(r['job_s'] for r in runs):.2f}s "
            f"({statistics.median(r['points_per_s'] for r in runs):,.0f} points/s), "
            f"median wall {statistics.median(r['wall_s'] for r in runs):.2f}s"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
