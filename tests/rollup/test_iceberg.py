"""Published Iceberg metadata (PROTOCOL §4.1): DuckDB's ``iceberg_scan`` and pyiceberg read
exactly the rows of ``lm-rollup query``, every commit is published, a crash between a
commit and its publish is repaired, and vacuum keeps the files of published snapshots."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from pyiceberg.table import StaticTable
from structlog.testing import capture_logs

from protocol import keys
from protocol.clock import ManualClock
from protocol.setsum import Setsum
from rollup.iceberg.publish import publish, publish_or_log, published_versions, table_url
from rollup.lifecycle.vacuum import vacuum
from rollup.read import sql
from rollup.read.reader import scan
from rollup.table.commit import LoadedSnapshot
from rollup.table.owner import OwnerLease
from rollup.table.schemas import POINTS_SCHEMA, ROLLUP_1M_SCHEMA
from store.fs import FileSystemStore
from tests.rollup.dataset_builder import (
    commit_rows,
    hour_at,
    hour_start,
    make_batch,
    points,
)

RETENTION_S = 7 * 24 * 3600.0


class Dataset:
    """Commits on an fs store: v1 (cpu + mem points, one rollup_1m row, 2 batches), v2
    (replaces the cpu file, 1 more batch), further versions on demand."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = f"file://{root}"
        self.store = FileSystemStore(root, clock=ManualClock(hour_at(3).start_ns))
        self.clock = ManualClock(hour_at(3).start_ns)
        self.batches = [make_batch(hour_at(0), n) for n in range(3)]
        self.versions: list[LoadedSnapshot] = []

    async def commit(self, **changes: Any) -> LoadedSnapshot:
        owner = await OwnerLease.acquire(self.store, "job", 600, self.clock)
        try:
            loaded = await commit_rows(self.store, owner, self.clock, **changes)
        finally:
            await owner.release()
        self.clock.advance(60)
        self.versions.append(loaded)
        return loaded

    async def build(self) -> None:
        window = pa.table(
            {
                "window_start": [hour_start(hour_at(0))],
                "series": ['cpu{host="a"}'],
                "metric": ["cpu"],
                "labels": pa.array([[("host", "a")]], ROLLUP_1M_SCHEMA.field("labels").type),
                "count": [10],
                "sum": [45.0],
                "min": [0.0],
                "max": [9.0],
                "first_ts": [hour_start(hour_at(0))],
                "first": [0.0],
                "last_ts": [hour_start(hour_at(0)) + timedelta(seconds=9)],
                "last": [9.0],
            },
            schema=ROLLUP_1M_SCHEMA,
        )
        v1 = await self.commit(
            data=[
                ("points", hour_at(0), points(hour_at(0), 10, labels={"host": "a"})),
                ("points", hour_at(1), points(hour_at(1), 10, metric="mem", seq_start=10)),
                ("rollup_1m", hour_at(0), window),
            ],
            ledger=[b.row for b in self.batches[:2]],
        )
        await self.commit(
            data=[("points", hour_at(0), points(hour_at(0), 5, value_start=100))],
            remove=[v1.snapshot.data_files("points")[0].path],
            ledger=[self.batches[2].row],
        )

    async def publish(self) -> list[int]:
        return await publish(self.store, store_url=self.url, retention_s=RETENTION_S)

    async def query(self, table: str, version: int | None = None) -> list[dict[str, Any]]:
        rows = await scan(
            self.store,
            table,
            filesystem=pafs.LocalFileSystem(),
            root=str(self.root),
            version=version,
        )
        return canonical(rows)

    def metadata(self, table: str, version: int) -> str:
        return str(self.root / keys.rollup_iceberg_metadata_key(table, version))


def canonical(rows: pa.Table) -> list[dict[str, Any]]:
    """Rows as comparable dicts (maps as sorted pairs), in a total order."""
    result = []
    for row in rows.to_pylist():
        for name, value in row.items():
            if isinstance(value, dict):
                row[name] = sorted(value.items())
            elif isinstance(value, list):
                row[name] = sorted(tuple(pair) for pair in value)
        result.append(row)
    return sorted(result, key=lambda r: json.dumps(r, default=str, sort_keys=True))


@pytest.fixture
async def dataset(tmp_path: Path) -> Dataset:
    built = Dataset(tmp_path / "store")
    await built.build()
    return built


async def test_duckdb_and_pyiceberg_read_exactly_the_rows_of_query(dataset: Dataset) -> None:
    assert await dataset.publish() == [2]  # a first publish starts at the latest version
    connection = sql.open_duckdb()
    for table, expected_rows in [("points", 15), ("rollup_1m", 1)]:
        ours = await dataset.query(table)
        assert len(ours) == expected_rows
        directory = table_url(dataset.url, table)
        for location in (directory, dataset.metadata(table, 2)):
            theirs = connection.sql(f"SELECT * FROM iceberg_scan('{location}')").to_arrow_table()
            assert canonical(theirs) == ours, (table, location)
        iceberg = StaticTable.from_metadata(dataset.metadata(table, 2))
        assert canonical(iceberg.scan().to_arrow()) == ours
    # The snapshot says which rollup version it is and the setsum of every batch in it.
    stored, _ = await dataset.store.get(keys.rollup_iceberg_metadata_key("points", 2))
    body = json.loads(stored)
    (summary,) = [s["summary"] for s in body["snapshots"]]
    expected_setsum = Setsum.of(
        (b.manifest.identity.manifest_id, b.manifest.frame_sha256) for b in dataset.batches
    ).hex
    assert summary["lightmetrics.version"] == "2"
    assert summary["lightmetrics.setsum"] == expected_setsum
    assert summary["lightmetrics.manifest-key"] == dataset.versions[1].manifest_key
    # An empty result is still the right schema.
    empty = connection.sql(
        f"SELECT * FROM iceberg_scan('{table_url(dataset.url, 'points')}') WHERE seq < 0"
    ).to_arrow_table()
    assert empty.num_rows == 0 and empty.column_names == list(POINTS_SCHEMA.names)


async def test_every_commit_is_published_and_a_missed_publish_is_repaired(
    tmp_path: Path,
) -> None:
    dataset = Dataset(tmp_path / "store")
    await dataset.build()
    assert await dataset.publish() == [2]
    assert await dataset.publish() == []  # nothing new
    # Two commits whose publish never ran (a crash after the pointer swap): repaired in
    # order by the next publish, and each gets its own Iceberg snapshot.
    await dataset.commit(data=[("points", hour_at(2), points(hour_at(2), 3, seq_start=40))])
    await dataset.commit(data=[("points", hour_at(2), points(hour_at(2), 4, seq_start=50))])
    assert await dataset.publish() == [3, 4]
    assert await published_versions(dataset.store) == {2, 3, 4}
    for version in (2, 3, 4):
        iceberg = StaticTable.from_metadata(dataset.metadata("points", 4))
        rows = iceberg.scan(snapshot_id=version).to_arrow()
        assert canonical(rows) == await dataset.query("points", version), version
    hint = keys.rollup_iceberg_version_hint_key("points")
    assert (await dataset.store.get(hint))[0] == b"4"
    # A crash after writing v5's metadata but before moving the hint: the next publish
    # finds the metadata there and builds v6 on it.
    await dataset.commit(data=[("points", hour_at(2), points(hour_at(2), 1, seq_start=60))])
    assert await dataset.publish() == [5]
    await dataset.store.put(hint, b"4")
    await dataset.commit(data=[("points", hour_at(2), points(hour_at(2), 1, seq_start=70))])
    assert 6 in await dataset.publish()
    assert (await dataset.store.get(hint))[0] == b"6"
    iceberg = StaticTable.from_metadata(dataset.metadata("points", 6))
    assert [s.snapshot_id for s in iceberg.metadata.snapshots] == [2, 3, 4, 5, 6]
    assert canonical(iceberg.scan().to_arrow()) == await dataset.query("points")


async def test_vacuum_keeps_the_files_of_published_snapshots(dataset: Dataset) -> None:
    replaced = dataset.versions[0].snapshot.data_files("points")[0].path
    await publish(
        dataset.store, store_url=dataset.url, retention_s=RETENTION_S, latest=dataset.versions[0]
    )
    assert await dataset.publish() == [2]
    report = await vacuum(
        dataset.store, clock=dataset.clock, retain_versions=1, min_age_s=0, dry_run=True
    )
    # Version 1 is beyond --retain-versions 1, but Iceberg still lists it: its replaced
    # file stays, and an Iceberg reader can still time-travel to it.
    assert report.retained_versions == [2, 1]
    assert replaced not in report.deleted
    iceberg = StaticTable.from_metadata(dataset.metadata("points", 2))
    assert canonical(iceberg.scan(snapshot_id=1).to_arrow()) == await dataset.query("points", 1)


async def test_a_failed_publish_is_logged_and_left_for_the_next_run(dataset: Dataset) -> None:
    hint = keys.rollup_iceberg_version_hint_key("points")
    await dataset.store.put(hint, b"not a version")
    owner = await OwnerLease.acquire(dataset.store, "job", 600, dataset.clock)
    with capture_logs() as logs:
        published = await publish_or_log(
            dataset.store, store_url=dataset.url, retention_s=RETENTION_S, owner=owner
        )
    assert published == []
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [
        "rollup_iceberg_publish_failed"
    ]
    await dataset.store.delete(hint)
    assert await publish_or_log(
        dataset.store, store_url=dataset.url, retention_s=RETENTION_S, owner=owner
    ) == [2]


async def test_deleted_rows_are_position_deletes_until_compaction_rewrites_them(
    dataset: Dataset,
) -> None:
    from rollup.lifecycle import compaction
    from rollup.lifecycle import delete as delete_mod
    from rollup.table.storage import StoreAccess

    start = hour_start(hour_at(0))
    for request in (
        delete_mod.DeleteRequest(  # 3 of the 5 cpu points of hour 0 (points only)
            metric="cpu",
            start=start + timedelta(seconds=2),
            end=start + timedelta(hours=1),
            tables=("points",),
            reason="r1",
            requested_by="t",
        ),
        delete_mod.DeleteRequest(  # the one rollup_1m row
            metric="cpu",
            labels=(("host", "a"),),
            end=start + timedelta(hours=1),
            reason="r2",
            requested_by="t",
        ),
    ):
        await delete_mod.delete(dataset.store, request, clock=dataset.clock)
    assert await dataset.publish() == [4]
    connection = sql.open_duckdb()

    async def same_rows_everywhere(version: int, counts: dict[str, int]) -> None:
        for table, expected in counts.items():
            ours = await dataset.query(table, version)
            assert len(ours) == expected, table
            location = dataset.metadata(table, version)
            theirs = connection.sql(f"SELECT * FROM iceberg_scan('{location}')").to_arrow_table()
            assert canonical(theirs) == ours, (table, version)
            iceberg = StaticTable.from_metadata(location)
            assert canonical(iceberg.scan().to_arrow()) == ours, (table, version)

    await same_rows_everywhere(4, {"points": 12, "rollup_1m": 0})
    deletes = [
        i.key async for i in dataset.store.list(keys.ROLLUP_ICEBERG_PREFIX) if "/del-" in i.key
    ]
    assert len(deletes) == 2  # one per (data file, pending deletes)

    await compaction.compact(dataset.store, access=StoreAccess(dataset.url), clock=dataset.clock)
    assert await dataset.publish() == [5]
    await same_rows_everywhere(5, {"points": 12, "rollup_1m": 0})
    stored, _ = await dataset.store.get(keys.rollup_iceberg_metadata_key("points", 5))
    (summary,) = [s["summary"] for s in json.loads(stored)["snapshots"] if s["snapshot-id"] == 5]
    assert summary["total-records"] == "12"  # the rows left the files
    await same_rows_everywhere(4, {"points": 12, "rollup_1m": 0})  # older metadata still reads
