"""`verify`: per-hour setsums from the catalog (or, ``from_manifests``, from accepted/v1/
itself) against the ledger; CLI exit codes."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from pathlib import Path
from random import Random

import pytest

from config.settings import Settings, StoreSettings
from index.catalog import CatalogWriter
from index.rows import IndexFileError, accepted_row
from protocol import keys
from protocol.clock import ManualClock
from protocol.records import AcceptedManifest
from rollup.cli.read import add_read_commands
from rollup.read.verify import verify
from rollup.table.commit import commit, load_latest
from rollup.table.ledger import ledger_table, ledger_totals, write_ledger_files
from rollup.table.manifest import Changes
from rollup.table.owner import OwnerLease
from store.base import ObjectStore
from store.fs import FileSystemStore
from store.memory import MemoryStore
from tests.rollup.dataset_builder import (
    Batch,
    accept,
    commit_rows,
    hour_at,
    make_batch,
)

H0, H1 = hour_at(0).iso, hour_at(1).iso


async def setup(store: ObjectStore) -> tuple[OwnerLease, ManualClock, list[Batch]]:
    clock = ManualClock(hour_at(3).start_ns)
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    batches = [make_batch(hour_at(0), n) for n in range(3)] + [
        make_batch(hour_at(1), n, agent="agent-b") for n in range(2)
    ]
    await accept(store, batches)
    return owner, clock, batches


async def test_a_complete_rollup_verifies() -> None:
    store = MemoryStore()
    owner, clock, batches = await setup(store)
    await commit_rows(store, owner, clock, ledger=[b.row for b in batches[:2]])
    await commit_rows(store, owner, clock, ledger=[b.row for b in batches[2:]])
    report = await verify(store)
    assert report.ok and report.version == 2
    assert [(h.hour, h.complete, h.accepted.batches) for h in report.hours] == [
        (H0, True, 3),
        (H1, True, 2),
    ]
    assert report.hours[0].describe() == "complete (3 batches, 30 records)"


async def test_missing_and_extra_batches_are_counted_per_hour() -> None:
    store = MemoryStore()
    owner, clock, batches = await setup(store)
    stranger = make_batch(hour_at(1), 9, agent="never-accepted")
    # Hour 0 lacks batch 2; hour 1 has a batch nobody accepted and batch 0 twice.
    rows = [b.row for b in batches[:2]] + [b.row for b in batches[3:]] + [stranger.row]
    await commit_rows(store, owner, clock, ledger=rows)
    await commit_rows(store, owner, clock, ledger=[batches[3].row])
    report = await verify(store)
    assert not report.ok
    by_hour = {h.hour: h for h in report.hours}
    assert (by_hour[H0].missing, by_hour[H0].extra) == (1, 0)
    assert (by_hour[H1].missing, by_hour[H1].extra) == (0, 2)
    assert by_hour[H0].describe() == "missing 1 / extra 0"


async def test_a_ledger_header_that_disagrees_with_its_files_is_reported() -> None:
    store = MemoryStore()
    owner, clock, batches = await setup(store)
    hour0 = [b.row for b in batches[:3]]
    written = await write_ledger_files(store, hour0)
    wrong_totals = ledger_totals(ledger_table(hour0[:2]))
    await commit(
        store,
        base=None,
        changes=Changes(added_ledger_files=written.added_ledger_files, ledger_delta=wrong_totals),
        owner=owner,
        clock=clock,
    )
    report = await verify(store, first_hour=hour_at(0), last_hour=hour_at(0))
    assert [h.hour for h in report.hours] == [H0]
    (hour,) = report.hours
    assert (hour.missing, hour.extra, hour.complete) == (0, 0, False)
    assert "ledger totals disagree" in hour.describe()


async def test_from_manifests_checks_the_authority_where_the_catalog_lacks_a_record() -> None:
    store = MemoryStore()
    owner, clock, batches = await setup(store)
    await commit_rows(store, owner, clock, ledger=[b.row for b in batches])
    assert (await verify(store, from_manifests=True)).ok
    # A manifest the index never cataloged (its log row was lost, no audit since).
    uncataloged = make_batch(hour_at(0), 7)
    await store.put(uncataloged.manifest.manifest_key, uncataloged.manifest.to_json())

    assert (await verify(store)).ok  # the rollup holds everything the index knows ...
    report = await verify(store, from_manifests=True)  # ... but not everything accepted
    by_hour = {h.hour: h for h in report.hours}
    assert (by_hour[H0].missing, by_hour[H0].extra) == (1, 0) and by_hour[H1].complete
    assert by_hour[H0].accepted.batches == 4


async def test_from_manifests_counts_unreadable_and_misplaced_manifests() -> None:
    store = MemoryStore()
    owner, clock, batches = await setup(store)
    await commit_rows(store, owner, clock, ledger=[b.row for b in batches])
    await store.put(f"{keys.ACCEPTED_PREFIX}junk.json", b"{}")
    misplaced = make_batch(hour_at(0), 8).manifest.manifest_key
    await store.put(misplaced, batches[0].manifest.to_json())  # names another key

    report = await verify(store, from_manifests=True)

    assert report.unparseable_keys == 2 and not report.ok
    assert all(h.complete for h in report.hours)  # neither is counted as a batch
    assert (await verify(store)).ok  # the catalog never held either


async def test_an_unreadable_catalog_file_is_an_error_not_an_empty_hour() -> None:
    store = MemoryStore()
    owner, clock, batches = await setup(store)
    await commit_rows(store, owner, clock, ledger=[b.row for b in batches])
    await store.put(keys.index_catalog_key(hour_at(0), 9, 1), b"not parquet")
    with pytest.raises(IndexFileError):
        await verify(store)


async def test_hours_without_a_rollup_are_missing_everything() -> None:
    store = MemoryStore()
    await setup(store)
    report = await verify(store)
    assert report.version is None
    assert [(h.hour, h.missing, h.extra) for h in report.hours] == [(H0, 3, 0), (H1, 2, 0)]


def run_cli(store_dir: Path, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_read_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    settings = Settings(store=StoreSettings(url=f"file://{store_dir}"))
    code: int = args.handler(args, settings)
    return code


def test_cli_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    async def build() -> None:
        store = FileSystemStore(tmp_path)
        owner, clock, batches = await setup(store)
        await commit_rows(store, owner, clock, ledger=[b.row for b in batches[1:]])
        assert await load_latest(store) is not None
        await store.close()

    asyncio.run(build())

    assert run_cli(tmp_path, "verify") == 1
    out = capsys.readouterr().out
    assert f"{H0}  missing 1 / extra 0" in out
    assert f"{H1}  complete (2 batches, 20 records)" in out
    assert run_cli(tmp_path, "verify", "--from", H1, "--to", H1) == 0
    assert run_cli(tmp_path, "verify", "--format", "json") == 1
    assert '"missing": 1' in capsys.readouterr().out
    assert run_cli(tmp_path, "verify", "--version", "7") == 2
    assert "version 7 does not exist" in capsys.readouterr().err


async def _supersede(store: ObjectStore, manifest: AcceptedManifest) -> None:
    """What a full audit does on finding the store's record differ from the catalog's row
    (PROTOCOL §3.7): it writes the record as a superseding row (``source = "audit"``) in a
    newer catalog file (a later writer epoch) of the record's hour."""
    writer = CatalogWriter(
        store=store, clock=ManualClock(hour_at(4).start_ns), rng=Random(9), epoch=7
    )
    row = dataclasses.replace(accepted_row(manifest), source="audit")
    await writer.write(manifest.accepted_hour, [row], writer="steady")


async def test_a_key_superseded_with_another_hash_after_the_rollup_fails_its_hour() -> None:
    """The ledger holds batch 1 of hour 0 with the hash its first catalog row had; an audit
    then supersedes that key with the store's record, which names another hash: verify
    fails hour 0 naming the key and both hashes. Without the superseding row it passes."""
    store = MemoryStore()
    owner, clock, batches = await setup(store)
    await commit_rows(store, owner, clock, ledger=[b.row for b in batches])
    assert (await verify(store)).ok

    old = batches[1].manifest
    sha = "ab" * 32
    await _supersede(
        store, old.model_copy(update={"frame_sha256": sha, "raw_blob_key": keys.raw_blob_key(sha)})
    )

    report = await verify(store)
    assert not report.ok
    by_hour = {h.hour: h for h in report.hours}
    assert by_hour[H1].complete
    hour0 = by_hour[H0]
    assert not hour0.complete and hour0.superseded_total == 1
    (named,) = hour0.superseded
    assert old.manifest_key in named and old.frame_sha256 in named and sha in named
    assert old.manifest_key in hour0.describe()


async def test_a_key_superseded_into_another_hour_fails_the_hour_whose_ledger_holds_it() -> None:
    """The store's record of batch 1 has another accepted_at, in hour 1: the audit writes
    it as a superseding row of hour 1, and hour 0's old row stays in hour 0's files. Hour
    0's totals still agree with its ledger, but the row that counts for the key is in
    hour 1: verify fails hour 0 naming the key and the hour (and hour 1 lacks it)."""
    store = MemoryStore()
    owner, clock, batches = await setup(store)
    await commit_rows(store, owner, clock, ledger=[b.row for b in batches])
    old = batches[1].manifest
    moved = old.model_copy(update={"accepted_at_unix_ns": hour_at(1).start_ns + 5 * 10**9})
    await _supersede(store, moved)

    report = await verify(store)
    by_hour = {h.hour: h for h in report.hours}
    hour0 = by_hour[H0]
    assert hour0.accepted == hour0.ledger  # the totals alone would call it complete
    assert not hour0.complete and hour0.superseded_total == 1
    (named,) = hour0.superseded
    assert old.manifest_key in named and f"in hour {H1}" in named
    assert (by_hour[H1].missing, by_hour[H1].extra) == (1, 0)
