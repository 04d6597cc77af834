"""Deletes (tombstones, PROTOCOL §4.1) without Spark: the model, its stored form, masking
in the reader, in DuckDB and in a dry run, the CLI, history, and the commit's races."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from protocol import keys
from protocol.clock import ManualClock
from rollup.__main__ import main
from rollup.lifecycle import delete as delete_mod
from rollup.read import history as history_mod
from rollup.read import reader, sql
from rollup.table import tombstones
from rollup.table.commit import load_latest
from rollup.table.manifest_codec import snapshot_from_json
from rollup.table.owner import OwnerLease
from rollup.table.storage import arrow_filesystem
from rollup.table.tombstones import Tombstone, TombstoneError
from store.fs import FileSystemStore
from tests.rollup.dataset_builder import commit_rows, hour_at, hour_start, points

TID = "00000000-0000-4000-8000-00000000000a"
H0 = hour_start(hour_at(0))


def tombstone(**overrides: object) -> Tombstone:
    fields: dict[str, object] = {
        "id": TID,
        "metric": "cpu",
        "labels": (("host", "a"),),
        "end": H0 + timedelta(hours=2),
        "tables": ("points", "rollup_1m"),
        "requested_by": "ops@example",
        "reason": "leaked secret in a label",
        "created_at": "2026-11-21T13:00:00Z",
    }
    fields.update(overrides)
    return Tombstone(**fields)  # type: ignore[arg-type]


# --- the model -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"reason": "  "}, "reason"),
        ({"tables": ()}, "tables"),
        ({"tables": ("points", "nope")}, "unknown table"),
        ({"agent_id": "a1"}, "rollup_1m has no agent_id"),
        ({"start": H0 + timedelta(hours=3)}, "must be before"),
        ({"id": "not-a-uuid"}, "uuid"),
        ({"labels": (("host", "a"), ("host", "b"))}, "each name once"),
        ({"metric": ""}, "metric"),
    ],
)
def test_a_bad_delete_request_is_refused_naming_the_field(
    overrides: dict[str, object], problem: str
) -> None:
    with pytest.raises((TombstoneError, keys.KeyFormatError), match=problem):
        tombstone(**overrides)


def test_stored_form_round_trips_and_old_snapshots_still_parse() -> None:
    original = tombstone(start=H0, agent_id="a1", tables=("points",), added_version=3)
    assert Tombstone.from_dict(json.loads(json.dumps(original.to_dict()))) == original
    record = original.file_json()
    assert record["schema"] == tombstones.TOMBSTONE_SCHEMA and "added_version" not in record
    with pytest.raises(TombstoneError, match="to"):
        Tombstone.from_dict({**original.to_dict(), "to": 5})
    # A snapshot written before deletes existed listed removed paths under "tombstones".
    old = {
        "schema": "lightmetrics.rollup_manifest.v1",
        "version": 2,
        "previous_manifest_key": keys.rollup_manifest_key(1, "a"),
        "created_at": "2026-11-21T13:00:00Z",
        "owner_epoch": 1,
        "commit_id": "b",
        "tables": {},
        "tombstones": ["rollup/v1/tables/rollup_1m/date=2026-11-21/hour=10/x.parquet"],
        "ledger": {"files": [], "hours": {}},
    }
    parsed = snapshot_from_json(json.dumps(old))
    assert parsed.tombstones == ()
    assert parsed.removed_files == tuple(old["tombstones"])  # type: ignore[arg-type]


def test_a_file_needs_only_the_tombstones_committed_at_or_after_it() -> None:
    t5 = tombstone(added_version=5)
    assert tombstones.pending_for([t5], "points", added_version=4, hour=hour_at(0)) == (t5,)
    # Written at version 6 on a base that had the tombstone: already applied.
    assert tombstones.pending_for([t5], "points", added_version=6, hour=hour_at(0)) == ()
    # Outside the range, another table, or a metric the file's statistics rule out.
    assert tombstones.pending_for([t5], "points", added_version=1, hour=hour_at(2)) == ()
    points_only = tombstone(added_version=5, tables=("points",))
    assert (
        tombstones.pending_for([points_only], "rollup_1m", added_version=1, hour=hour_at(0)) == ()
    )
    assert tombstones.pending_for(
        [t5], "points", added_version=1, hour=hour_at(0), metric_min="cpu", metric_max="mem"
    ) == (t5,)
    assert (
        tombstones.pending_for(
            [t5], "points", added_version=1, hour=hour_at(0), metric_min="mem", metric_max="net"
        )
        == ()
    )


def test_matching_needs_every_label_and_the_time_range() -> None:
    rows = pa.concat_tables(
        [
            points(hour_at(0), 3, labels={"host": "a", "dc": "x"}),
            points(hour_at(0), 2, labels={"host": "b"}),
            points(hour_at(0), 2),  # no labels at all: never matches a label equality
            points(hour_at(0), 2, metric="mem", labels={"host": "a"}),
        ]
    )
    hit = tombstones.matches([tombstone(end=H0 + timedelta(seconds=2))], "points", rows)
    assert hit.to_pylist() == [True, True, False] + [False] * 6
    kept, dropped = tombstones.drop_masked([tombstone()], "points", rows)
    assert dropped == 3 and kept.num_rows == 6


# --- masking through every reader, on an fs store -----------------------------------------


@pytest.fixture
async def dataset(tmp_path: Path) -> FileSystemStore:
    """v1: cpu{host=a} 10 points, cpu{host=b} 10 points (hour 0), mem 5 points (hour 1)."""
    store = FileSystemStore(tmp_path / "store")
    clock = ManualClock(hour_at(3).start_ns)
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    await commit_rows(
        store,
        owner,
        clock,
        data=[
            ("points", hour_at(0), points(hour_at(0), 10, labels={"host": "a"})),
            ("points", hour_at(0), points(hour_at(0), 10, labels={"host": "b"}, seq_start=10)),
            ("points", hour_at(1), points(hour_at(1), 5, metric="mem", seq_start=20)),
        ],
    )
    await owner.release()
    return store


async def _scan(store: FileSystemStore, version: int | None = None) -> pa.Table:
    filesystem, root = arrow_filesystem(store.url)
    return await reader.scan(store, "points", filesystem=filesystem, root=root, version=version)


async def test_a_committed_delete_masks_rows_for_the_reader_and_duckdb(
    dataset: FileSystemStore,
) -> None:
    clock = ManualClock(hour_at(3).start_ns)
    request = delete_mod.DeleteRequest(
        metric="cpu",
        labels=(("host", "a"),),
        start=H0 + timedelta(seconds=3),
        reason="leaked",
        requested_by="ops",
    )
    wanted = request.tombstone(now_ns=clock.now_ns())
    filesystem, root = arrow_filesystem(dataset.url)
    preview = await delete_mod.preview(dataset, wanted, filesystem=filesystem, root=root)
    assert preview["points"].num_rows == 7 and preview["rollup_1m"].num_rows == 0

    tombstone_, committed = await delete_mod.delete(dataset, request, clock=clock)

    assert committed.snapshot.version == 2 and committed.snapshot.tombstones[0].added_version == 2
    assert tombstone_.end == hour_start(hour_at(3))  # "to" defaults to the delete's time
    assert (await dataset.head(tombstone_.key)).size > 0
    after = await _scan(dataset)
    assert after.num_rows == 25 - 7
    host_a = [r for r in after.to_pylist() if r["labels"] == [("host", "a")]]
    assert sorted(r["seq"] for r in host_a) == [0, 1, 2]
    assert (await _scan(dataset, version=1)).num_rows == 25  # time travel sees before
    stats = reader.ScanStats()
    await reader.scan(dataset, "points", filesystem=filesystem, root=root, stats=stats)
    assert stats.rows_masked == 7

    connection = duckdb.connect()
    location_url = dataset.url
    loaded = await load_latest(dataset)
    assert loaded is not None
    from config.store_url import parse_store_url

    sql.register_snapshot(connection, loaded.snapshot, parse_store_url(location_url))
    (count,) = connection.execute("SELECT count(*) FROM points").fetchone()  # type: ignore[misc]
    assert count == 18
    masked = connection.execute(
        "SELECT count(*) FROM points WHERE labels['host'] = 'a' AND seq >= 3"
    ).fetchone()
    assert masked == (0,)

    entry = (await history_mod.history(dataset, limit=1))[0]
    assert entry.version == 2 and "by ops (leaked)" in entry.as_row()["deletes"]  # type: ignore[operator]


async def test_a_delete_retried_after_a_lost_answer_is_committed_once(
    dataset: FileSystemStore,
) -> None:
    clock = ManualClock(hour_at(3).start_ns)
    wanted = tombstone()
    first = await delete_mod.commit_delete(dataset, wanted, clock=clock)
    # The same request again (its answer was lost): found in the snapshot, not re-added.
    again = await delete_mod.commit_delete(dataset, wanted, clock=clock)
    assert again.snapshot.version == first.snapshot.version == 2
    # Another request under the same id is refused, whatever it says.
    with pytest.raises(TombstoneError, match="exists with other content"):
        await delete_mod.commit_delete(dataset, tombstone(reason="other"), clock=clock)
    latest = await load_latest(dataset)
    assert latest is not None and latest.snapshot.version == first.snapshot.version
    assert [t.id for t in latest.snapshot.tombstones] == [TID]


async def test_nothing_to_delete_before_the_first_commit(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path / "empty")
    with pytest.raises(delete_mod.NothingToDelete):
        await delete_mod.commit_delete(store, tombstone(), clock=ManualClock(0))
    assert [info.key async for info in store.list("rollup/")] == []


# --- the CLI -------------------------------------------------------------------------------


def _config(tmp_path: Path, store: FileSystemStore) -> list[str]:
    config = tmp_path / "lm.toml"
    config.write_text(f'[store]\nurl = "{store.url}"\n')
    return ["--config", str(config)]


async def test_cli_dry_run_then_delete_then_history(
    dataset: FileSystemStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = _config(tmp_path, dataset)
    to = (H0 + timedelta(hours=1)).isoformat()
    args = ["delete", "--metric", "cpu", "--label", "host=b", "--to", to, "--reason", "gdpr 42"]
    assert await _cli([*flags, *args, "--dry-run", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert "points: 10 rows would be masked" in err and "rollup_1m: 0 rows" in err
    assert len(json.loads(out.split("== points\n", 1)[1])) == 10
    assert (await load_latest(dataset)).snapshot.version == 1  # type: ignore[union-attr]

    assert await _cli([*flags, *args, "--by", "dpo@example"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["version"] == 2 and summary["requested_by"] == "dpo@example"
    assert summary["iceberg_published"] == [2]  # Iceberg readers see the delete at once
    assert (await _scan(dataset)).num_rows == 15

    assert await _cli([*flags, "history", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert "dpo@example (gdpr 42)" in rows[0]["deletes"] and rows[1]["deletes"] == ""

    bad = [*flags, "delete", "--metric", "cpu", "--agent", "a", "--table", "rollup_1m"]
    assert await _cli([*bad, "--reason", "x"]) == 2
    assert "rollup_1m has no agent_id" in capsys.readouterr().err
    assert (
        await _cli([*flags, "delete", "--metric", "cpu", "--label", "oops", "--reason", "x"]) == 2
    )
    assert "expected NAME=VALUE" in capsys.readouterr().err
    assert (await load_latest(dataset)).snapshot.version == 2  # type: ignore[union-attr]


async def _cli(argv: list[str]) -> int:
    import asyncio

    # The CLI runs its own event loop: give it a thread of its own.
    return await asyncio.to_thread(main, argv)


def test_tombstone_sql_agrees_with_the_arrow_predicate() -> None:
    rows = pa.concat_tables(
        [
            points(hour_at(0), 4, labels={"host": "a"}),
            points(hour_at(0), 4, labels={"host": "b"}),
            points(hour_at(0), 4),
        ]
    )
    wanted = tombstone(start=H0 + timedelta(seconds=1), end=H0 + timedelta(seconds=3))
    expected = tombstones.matches([wanted], "points", rows).to_pylist()
    connection = duckdb.connect()
    connection.register("rows_", rows)
    got = connection.execute(
        f"SELECT coalesce({sql.tombstone_sql('points', wanted)}, false) FROM rows_"
    ).fetchall()
    assert [g for (g,) in got] == expected and sum(expected) == 2


@pytest.mark.parametrize("files", [1, 40])
async def test_a_delete_costs_the_same_few_requests_whatever_the_data_size(
    tmp_path: Path, files: int
) -> None:
    from store.counting import CountingStore

    inner = FileSystemStore(tmp_path / "store")
    clock = ManualClock(hour_at(3).start_ns)
    owner = await OwnerLease.acquire(inner, "job", 600, clock)
    data = [("points", hour_at(0), points(hour_at(0), 50, seq_start=i * 50)) for i in range(files)]
    await commit_rows(inner, owner, clock, data=data)
    await owner.release()
    store = CountingStore(inner)

    await delete_mod.commit_delete(store, tombstone(), clock=clock)  # type: ignore[arg-type]

    # The request record, the snapshot, the pointer; the latest snapshot read once.
    assert [op for op, _ in store.requests if op == "put"] == ["put"] * 3
    assert store.count("get") == 2 and store.count("list") == 0 and store.count("delete") == 0
