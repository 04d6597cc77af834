"""Rollup job fixtures: ONE Spark session for the whole test session, accepted batches
written as the collector writes them and cataloged as the reconciler does (catalog files
and rollup work markers, PROTOCOL §3.7), and an independent expected rollup.

`expected_rollup` recomputes ``rollup_1m`` from the frames sent with nothing from the job:
`protocol.frame.decode_frame`, `rollup.table.series.canonical_series` (the reference, not the
vectorised version) and pyarrow's own group-by, with first/last taken from a full sort.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from config.settings import RollupSettings
from protocol import keys
from protocol.clock import Clock
from protocol.frame import decode_frame
from protocol.frame_encode import encode_frame, points_table
from protocol.records import AcceptedManifest
from rollup.job.run import RunHooks, RunSummary, run_rollup
from rollup.read.reader import scan
from rollup.table.owner import OwnerLease
from rollup.table.series import canonical_series
from rollup.table.storage import StoreAccess
from store.base import ObjectStore
from store.fs import FileSystemStore
from tests.rollup.dataset_builder import catalog_manifests
from tests.rollup.spark_cluster import StandaloneCluster, start_cluster

if False:  # pragma: no cover - typing only, pyspark is imported lazily
    from pyspark.sql import SparkSession

HOUR_NS = 3600 * 1_000_000_000
# A fixed hour, far from "now", so accepted hours and data hours are easy to tell apart.
DATA_START_NS = keys.UtcHour.parse_iso("2026-11-21T10").start_ns


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A Spark standalone master and two 1-core workers, separate JVMs on 127.0.0.1, for
    the tests of one module (`tests.rollup.spark_cluster`); stopped by process group."""
    cluster = start_cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def fs_store(tmp_path: Path) -> FileSystemStore:
    return FileSystemStore(tmp_path / "store")


def settings(**overrides: Any) -> RollupSettings:
    values: dict[str, Any] = {"owner_lease_ttl_s": 60.0, "parquet_row_group_size": 50_000}
    values.update(overrides)
    return RollupSettings(**values)


async def run(
    spark: SparkSession,
    store: FileSystemStore,
    *,
    hooks: RunHooks | None = None,
    owner: OwnerLease | None = None,
    clock: Clock | None = None,
    **overrides: Any,
) -> RunSummary:
    return await run_rollup(
        spark,
        store,
        access=StoreAccess(store.url),
        settings=settings(**overrides),
        owner=owner,
        hooks=hooks,
        clock=clock,
    )


# --- accepted batches --------------------------------------------------------------------


@dataclass(frozen=True)
class SentFrame:
    """A frame as sent and accepted: its bytes, identity and accepted manifest."""

    frame: bytes
    manifest: AcceptedManifest

    @property
    def sha256(self) -> str:
        return self.manifest.frame_sha256

    @property
    def manifest_id(self) -> str:
        return self.manifest.identity.manifest_id


def make_frame(
    rows: Sequence[tuple[int, str, float, dict[str, str] | None]],
    *,
    agent_id: str = "agent-a",
    boot_id: uuid.UUID | None = None,
    seq_start: int = 0,
    accepted_at_ns: int | None = None,
) -> SentFrame:
    """One frame of ``(ts_ns, metric, value, labels)`` rows and its accepted manifest."""
    boot = boot_id or uuid.UUID("5f0c6a2e-0000-4000-8000-0000000000b0")
    table = points_table(
        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]
    )
    frame = encode_frame(agent_id=agent_id, boot_id=boot, seq_start=seq_start, points=table)
    manifest = AcceptedManifest.of_frame(
        frame,
        accepted_at_unix_ns=accepted_at_ns if accepted_at_ns is not None else time.time_ns(),
        collector_id="test-collector",
    )
    return SentFrame(frame, manifest)


async def accept(
    store: ObjectStore, frames: Sequence[SentFrame], *, markers: bool = True
) -> list[str]:
    """Store each frame as the collector does (raw blob, accepted manifest), then catalog
    the manifests as the reconciler does (`dataset_builder.catalog_manifests`: catalog
    files and, unless ``markers`` is False, their work markers). Returns the catalog keys."""
    for sent in frames:
        await store.put(sent.manifest.raw_blob_key, sent.frame)
        await store.put(sent.manifest.manifest_key, sent.manifest.to_json())
    return await catalog_manifests(store, [sent.manifest for sent in frames], markers=markers)


# --- expected results ----------------------------------------------------------------------

ROLLUP_COLUMNS = ("count", "sum", "min", "max", "first_ts", "first", "last_ts", "last")


def expected_rollup(frames: Sequence[SentFrame]) -> dict[tuple[int, str], dict[str, Any]]:
    """Per (window_start µs, series): the rollup_1m values, from the frames alone."""
    parts = []
    for sent in frames:
        frame = decode_frame(sent.frame)
        points = frame.points
        rows = points.num_rows
        parts.append(
            pa.table(
                {
                    "ts": pc.divide(points["ts"].cast(pa.int64()), 1000),
                    "series": [
                        canonical_series(m, dict(lab) if lab else None)
                        for m, lab in zip(
                            points["metric"].to_pylist(), points["labels"].to_pylist(), strict=True
                        )
                    ],
                    "value": points["value"],
                    "agent_id": [frame.agent_id] * rows,
                    "boot_id": [str(frame.boot_id)] * rows,
                    "seq": list(range(frame.seq_start, frame.seq_start + rows)),
                }
            )
        )
    table = pa.concat_tables(parts)
    table = table.append_column(
        "window", pc.multiply(pc.divide(table["ts"], 60_000_000), 60_000_000)
    )  # integer division: the timestamps here are after 1970
    finite = pc.is_finite(table["value"])
    counts = table.group_by(["window", "series"]).aggregate([([], "count_all")])
    sums = (
        table.filter(finite)
        .group_by(["window", "series"])
        .aggregate([("value", "sum"), ("value", "min"), ("value", "max")])
    )
    ordered = table.sort_by(
        [("window", "ascending"), ("series", "ascending"), ("ts", "ascending"),
         ("agent_id", "ascending"), ("boot_id", "ascending"), ("seq", "ascending")]
    )  # fmt: skip
    ends = ordered.group_by(["window", "series"], use_threads=False).aggregate(
        [("ts", "first"), ("value", "first"), ("ts", "last"), ("value", "last")]
    )
    result: dict[tuple[int, str], dict[str, Any]] = {}
    for row in counts.to_pylist():
        result[(row["window"], row["series"])] = {
            "count": row["count_all"], "sum": None, "min": None, "max": None,
        }  # fmt: skip
    for row in sums.to_pylist():
        result[(row["window"], row["series"])].update(
            sum=row["value_sum"], min=row["value_min"], max=row["value_max"]
        )
    for row in ends.to_pylist():
        result[(row["window"], row["series"])].update(
            first_ts=row["ts_first"],
            first=row["value_first"],
            last_ts=row["ts_last"],
            last=row["value_last"],
        )
    return result


async def committed_rollup(
    store: ObjectStore, endpoint_url: str | None = None
) -> dict[tuple[int, str], dict[str, Any]]:
    """The latest snapshot's rollup_1m rows, keyed like `expected_rollup`."""
    table = await read_table(store, "rollup_1m", endpoint_url)
    result: dict[tuple[int, str], dict[str, Any]] = {}
    for row in table.to_pylist():
        key = (_us(row["window_start"]), row["series"])
        assert key not in result, f"two rollup_1m rows for {key}"
        result[key] = {
            "count": row["count"], "sum": row["sum"], "min": row["min"], "max": row["max"],
            "first_ts": _us(row["first_ts"]), "first": row["first"],
            "last_ts": _us(row["last_ts"]), "last": row["last"],
            "metric": row["metric"], "labels": row["labels"],
        }  # fmt: skip
    return result


async def read_table(store: ObjectStore, table: str, endpoint_url: str | None = None) -> pa.Table:
    from rollup.table.storage import arrow_filesystem

    filesystem, root = arrow_filesystem(store.url, endpoint_url=endpoint_url)
    return await scan(store, table, filesystem=filesystem, root=root)


def assert_rollup_equal(
    got: dict[tuple[int, str], dict[str, Any]], want: dict[tuple[int, str], dict[str, Any]]
) -> None:
    assert set(got) == set(want), (sorted(set(got) ^ set(want)))[:5]
    for key, expected in want.items():
        for column in ROLLUP_COLUMNS:
            a, b = got[key][column], expected[column]
            if isinstance(a, float) and isinstance(b, float):
                same = (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12)
            else:
                same = a == b
            assert same, f"{key} {column}: got {a!r}, want {b!r}"


def _us(value: Any) -> int:
    return int(pa.scalar(value, pa.timestamp("us", tz="UTC")).cast(pa.int64()).as_py())


# --- the series index ---------------------------------------------------------------------

SeriesCounts = dict[tuple[int, str], tuple[int, int, int]]
"""Per (hour or day start µs, series): ``(count, first_ts µs, last_ts µs)``."""


async def index_rows(store: ObjectStore, table: str) -> SeriesCounts:
    """A ``series``/``series_day`` table's rows combined as readers combine them (counts
    add, first/last widen), by plain Python over its rows."""
    rows = await read_table(store, table)
    time_column = "hour_start" if table == "series" else "day_start"
    result: SeriesCounts = {}
    for row in rows.to_pylist():
        key = (_us(row[time_column]), row["series"])
        count, first, last = result.get(key, (0, 2**63 - 1, -(2**63)))
        result[key] = (
            count + row["count"],
            min(first, _us(row["first_ts"])),
            max(last, _us(row["last_ts"])),
        )
    return result


async def expected_index(store: ObjectStore, *, by_day: bool = False) -> SeriesCounts:
    """What the series index must hold: the committed ``points`` rows per (hour or day,
    series), counted by plain Python."""
    rows = await read_table(store, "points")
    span = (86400 if by_day else 3600) * 1_000_000
    result: SeriesCounts = {}
    for ts, series in zip(
        rows.column("ts").cast(pa.int64()).to_pylist(),
        rows.column("series").to_pylist(),
        strict=True,
    ):
        key = (ts // span * span, series)
        count, first, last = result.get(key, (0, ts, ts))
        result[key] = (count + 1, min(first, ts), max(last, ts))
    return result
