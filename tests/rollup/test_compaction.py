"""``lm-rollup compact`` without Spark: small files become one (or files of a target
size), deleted rows leave the files, reader totals are unchanged, and a commit that wins
the race makes compaction plan again."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from protocol.clock import ManualClock
from rollup.__main__ import main
from rollup.lifecycle import compaction
from rollup.lifecycle import delete as delete_mod
from rollup.table.commit import commit as real_commit
from rollup.table.commit import load_latest
from rollup.table.owner import OwnerLease
from rollup.table.storage import StoreAccess
from store.fs import FileSystemStore
from tests.rollup.conftest import expected_index, index_rows
from tests.rollup.dataset_builder import commit_rows, hour_at, hour_start, points
from tests.rollup.test_delete import _scan

H0 = hour_start(hour_at(0))


@pytest.fixture
async def small_files(tmp_path: Path) -> FileSystemStore:
    """Hour 0: three points files from three commits (cpu{host=a}, cpu{host=b}, mem);
    hour 1: one file of another metric."""
    store = FileSystemStore(tmp_path / "store")
    clock = ManualClock(hour_at(3).start_ns)
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    for seq, (metric, labels) in enumerate(
        [("cpu", {"host": "a"}), ("cpu", {"host": "b"}), ("mem", None)]
    ):
        rows = points(hour_at(0), 100, metric=metric, labels=labels, seq_start=seq * 100)
        await commit_rows(store, owner, clock, data=[("points", hour_at(0), rows)])
    hour1 = points(hour_at(1), 50, metric="disk")
    await commit_rows(store, owner, clock, data=[("points", hour_at(1), hour1)])
    await owner.release()
    return store


def _delete_host_a() -> delete_mod.DeleteRequest:
    return delete_mod.DeleteRequest(
        metric="cpu",
        labels=(("host", "a"),),
        start=H0 + timedelta(seconds=40),
        end=H0 + timedelta(hours=2),
        reason="test",
        requested_by="test",
    )


async def test_compaction_applies_deletes_and_keeps_what_readers_see(
    small_files: FileSystemStore,
) -> None:
    clock = ManualClock(hour_at(3).start_ns)
    await delete_mod.delete(small_files, _delete_host_a(), clock=clock)  # version 5
    seen_before = await _scan(small_files)
    assert seen_before.num_rows == 350 - 60

    report = await compaction.compact(small_files, access=StoreAccess(small_files.url), clock=clock)

    assert report.version == 6 and report.attempts == 1
    assert [(h["table"], h["hour"]) for h in report.hours] == [("points", hour_at(0).iso)]
    assert report.rows_before == 300 and report.rows_masked == 60 and report.rows_after == 240
    assert report.files_before == 3 and report.files_after == 1
    latest = await load_latest(small_files)
    assert latest is not None
    files = latest.snapshot.data_files("points")
    assert len(files) == 2 and set(latest.snapshot.removed_files) == {
        f.path for f in (await _v(small_files, 5)).data_files("points") if f.partition == hour_at(0)
    }
    # The rows left the file: read it directly, without the reader's masking.
    new = next(f for f in files if f.added_version == 6)
    physical = pq.read_table(f"{small_files.root}/{new.path}", partitioning=None)
    assert physical.num_rows == 240 and new.row_count == 240
    seen_after = await _scan(small_files)
    assert sorted(seen_after.column("seq").to_pylist()) == sorted(
        seen_before.column("seq").to_pylist()
    )
    # The hour's series rows are recomputed from the points left (these hours had none:
    # written before the index existed), in the same commit.
    by_hour = await index_rows(small_files, "series")
    expected = await expected_index(small_files)
    assert by_hour == {k: v for k, v in expected.items() if k[0] == _us(H0)}
    assert {s: c for (_, s), (c, _, _) in by_hour.items()} == {
        'cpu{host="a"}': 40,
        'cpu{host="b"}': 100,
        "mem": 100,
    }
    # Nothing left to do: a second run commits nothing.
    again = await compaction.compact(small_files, access=StoreAccess(small_files.url), clock=clock)
    assert again.hours == [] and again.version == 6


def _us(moment: datetime) -> int:
    return int(moment.timestamp()) * 1_000_000


async def _v(store: FileSystemStore, version: int):  # type: ignore[no-untyped-def]
    from rollup.table.commit import load_version

    return (await load_version(store, version)).snapshot


async def test_target_size_cuts_files_and_counts_stay_equal(small_files: FileSystemStore) -> None:
    clock = ManualClock(hour_at(3).start_ns)
    latest = await load_latest(small_files)
    assert latest is not None
    hour0 = [f for f in latest.snapshot.data_files("points") if f.partition == hour_at(0)]
    per_row = sum(f.size_bytes for f in hour0) / 300
    report = await compaction.compact(
        small_files,
        access=StoreAccess(small_files.url),
        clock=clock,
        hours=[hour_at(0)],
        target_bytes=max(1024, int(per_row * 70)),
    )
    assert report.rows_before == report.rows_after == 300 and report.rows_masked == 0
    assert report.files_after >= 3
    assert (await _scan(small_files)).num_rows == 350
    # Backfill: the rewritten hour had no series rows; now it has them (hour 1 is untouched).
    expected = await expected_index(small_files)
    assert await index_rows(small_files, "series") == {
        k: v for k, v in expected.items() if k[0] == _us(H0)
    }


async def test_a_commit_that_wins_the_race_makes_compaction_plan_again(
    small_files: FileSystemStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock(hour_at(3).start_ns)
    attempts: list[int] = []

    async def delete_first(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        attempts.append(1)
        if len(attempts) == 1:  # another commit lands between rewrite and commit
            await delete_mod.delete(small_files, _delete_host_a(), clock=clock)
        return await real_commit(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compaction, "commit", delete_first)
    report = await compaction.compact(small_files, access=StoreAccess(small_files.url), clock=clock)

    assert report.attempts == 2 and report.version == 6 and report.rows_masked == 60
    latest = await load_latest(small_files)
    assert latest is not None and [t.reason for t in latest.snapshot.tombstones] == ["test"]
    # The losing attempt's files were deleted: only reachable points files remain.
    on_disk = {i.key async for i in small_files.list("rollup/v1/tables/points/")}
    assert on_disk - {f.path for f in (await _v(small_files, 4)).data_files("points")} == {
        f.path for f in latest.snapshot.data_files("points") if f.added_version == 6
    }


async def test_cli_compact_prints_progress_and_a_report(
    small_files: FileSystemStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "lm.toml"
    config.write_text(f'[store]\nurl = "{small_files.url}"\n')
    code = await asyncio.to_thread(main, ["--config", str(config), "compact", "--table", "points"])
    assert code == 0
    out, err = capsys.readouterr()
    assert f"[1/1] points {hour_at(0).iso}: 3 files -> 1, 0 rows masked" in err
    assert '"files_after": 1' in out
    with pytest.raises(SystemExit) as bad:
        main(["--config", str(config), "compact", "--hour", "x"])
    assert bad.value.code == 2 and "not a YYYY-MM-DDTHH hour: 'x'" in capsys.readouterr().err


async def test_compaction_merges_an_hours_ledger_files_into_one(tmp_path: Path) -> None:
    """Issue 24 item 10: every run adds one ledger file per accepted hour, so
    ``ledger.files`` grew with runs x hours. Compaction merges each hour's files into one
    file of the same rows: ``ledger.hours`` (setsums) unchanged, ``verify`` still passes,
    and a hour with a single file is left alone."""
    from rollup.read.verify import verify
    from rollup.table.ledger import read_ledger
    from tests.rollup.dataset_builder import accept, make_batch

    store = FileSystemStore(tmp_path / "store")
    clock = ManualClock(hour_at(3).start_ns)
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    runs = [[make_batch(hour_at(0), 3 * run + n) for n in range(3)] for run in range(4)]
    runs.append([make_batch(hour_at(1), 100)])
    for batches in runs:  # five runs: four ledger files of hour 0, one of hour 1
        await accept(store, batches)
        await commit_rows(store, owner, clock, ledger=[b.row for b in batches])
    await owner.release()
    before = await load_latest(store)
    assert before is not None and len(before.snapshot.ledger_files) == 5
    rows_before = (await read_ledger(store, before.snapshot)).sort_by("manifest_id")

    report = await compaction.compact(store, access=StoreAccess(store.url), clock=clock)

    assert report.ledger_hours == [hour_at(0).iso]
    assert (report.ledger_files_before, report.ledger_files_after) == (4, 1)
    after = await load_latest(store)
    assert after is not None and after.snapshot.version == before.snapshot.version + 1
    assert len(after.snapshot.ledger_files) == 2
    assert after.snapshot.ledger_hours == before.snapshot.ledger_hours
    assert (await read_ledger(store, after.snapshot)).sort_by("manifest_id").equals(rows_before)
    assert (await verify(store)).ok
    again = await compaction.compact(store, access=StoreAccess(store.url), clock=clock)
    assert again.ledger_hours == [] and again.version == after.snapshot.version
