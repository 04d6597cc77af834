"""`collector.query.history_cache`: a restarted query collector reads again only the
sealed hours whose catalog changed, and never trusts totals its listing does not name.

The worlds are `tests.collector.test_coverage_history`'s: three sealed hours in the
snapshot, each hour's read counted. A "restart" is a new `Coverage` on the same store with
a new `HistoryCache` on the same directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.query.coverage import Coverage
from collector.query.history_cache import HistoryCache, listing_digest
from index.catalog import list_hour_files
from rollup.table.manifest import LedgerHour
from store.base import ObjectInfo
from tests.collector.test_coverage_history import (
    END,
    HOURS,
    MARGIN_S,
    History,
    history,
    manifest,
    sealed,
)
from tests.rollup.dataset_builder import catalog_manifests

__all__ = ["history"]  # the fixture, imported to be used here
STORE = "s3://bucket/lm http://127.0.0.1:4566"
TOTALS = LedgerHour(3, 30, "ab" * 32)


def restart(history: History, directory: Path, store_name: str = STORE) -> None:
    history.coverage = Coverage(
        history.store,
        settle_margin_s=MARGIN_S,
        refresh_interval_s=0.0,
        monotonic=history.clock.monotonic,
        history_wait_s=30,  # a correct run never waits this long: the answers are complete
        history_cache=HistoryCache(directory, store_name=store_name),
    )


async def read_with_a_cache(history: History, tmp_path: Path) -> Path:
    """A first process with a cache reads every hour once; the cache's directory."""
    directory = tmp_path / "history"
    restart(history, directory)
    assert await sealed(history) == END.start_ns
    assert history.reads.reads == {hour.iso: 1 for hour in HOURS}
    return directory


async def test_a_restart_reads_again_only_the_hours_whose_catalog_changed(
    history: History, tmp_path: Path
) -> None:
    directory = await read_with_a_cache(history, tmp_path)
    restart(history, directory)
    assert await sealed(history) == END.start_ns
    assert history.coverage.read_through_ns == END.start_ns
    assert history.reads.reads == {hour.iso: 1 for hour in HOURS}  # nothing read again

    # While it was down, a batch the snapshot lacks was cataloged in the middle hour (a
    # new catalog file): kept totals would call the hour included, wrongly.
    late = manifest(HOURS[1], 50)
    await catalog_manifests(history.store, [late], clock=history.clock)
    restart(history, directory)
    assert await sealed(history) == HOURS[1].start_ns
    assert history.reads.reads == {HOURS[0].iso: 1, HOURS[1].iso: 2, HOURS[2].iso: 1}

    restart(history, tmp_path / "history", store_name="s3://another-bucket/lm")
    assert await sealed(history) == HOURS[1].start_ns
    assert history.reads.reads == {HOURS[0].iso: 2, HOURS[1].iso: 3, HOURS[2].iso: 2}


def file(key: str, etag: str = '"e"', size: int = 10) -> ObjectInfo:
    return ObjectInfo(key=key, size=size, etag=etag, last_modified_ns=0)


def test_a_listing_names_totals_by_every_file_key_etag_and_size(tmp_path: Path) -> None:
    listing = listing_digest([file("a"), file("b")])
    assert listing == listing_digest([file("b"), file("a")])  # the order listed is not
    others = [
        [file("a")],
        [file("a"), file("b"), file("c")],
        [file("a"), file("b", etag='"f"')],  # a bucket made again, the same names
        [file("a"), file("b", size=11)],
    ]
    assert listing not in {listing_digest(files) for files in others}
    cache = HistoryCache(tmp_path, store_name=STORE)
    cache.put("2026-11-21T10", listing, TOTALS)
    assert cache.get("2026-11-21T10", listing) == TOTALS
    assert cache.get("2026-11-21T10", listing_digest(others[0])) is None
    assert cache.get("2026-11-21T11", listing) is None


def test_a_torn_or_altered_line_is_not_trusted_and_not_appended_to(tmp_path: Path) -> None:
    cache = HistoryCache(tmp_path, store_name=STORE)
    for n, hour in enumerate(("2026-11-21T10", "2026-11-21T11", "2026-11-21T12")):
        cache.put(hour, f"{n:064x}", TOTALS)
    lines = cache.path.read_text().splitlines(keepends=True)
    altered = lines[1].replace('"batches":3', '"batches":4')
    cache.path.write_text(lines[0] + altered + lines[2][:40])  # the last one torn

    again = HistoryCache(tmp_path, store_name=STORE)
    assert len(again) == 1 and again.get("2026-11-21T10", f"{0:064x}") == TOTALS
    again.put("2026-11-21T12", f"{2:064x}", TOTALS)  # not run on from the torn line
    assert HistoryCache(tmp_path, store_name=STORE).get("2026-11-21T12", f"{2:064x}") == TOTALS


def test_the_file_is_rewritten_when_most_of_its_lines_are_superseded(tmp_path: Path) -> None:
    cache = HistoryCache(tmp_path, store_name=STORE)
    for n in range(200):  # one hour read again and again
        cache.put("2026-11-21T10", f"{n:064x}", TOTALS)
    assert len(cache.path.read_text().splitlines()) == 200
    again = HistoryCache(tmp_path, store_name=STORE)
    assert cache.path.read_text().count("\n") == 1
    assert again.get("2026-11-21T10", f"{199:064x}") == TOTALS


def test_a_disk_that_fails_a_write_turns_the_cache_off_not_the_reader(tmp_path: Path) -> None:
    cache = HistoryCache(tmp_path, store_name=STORE)
    cache.path.mkdir()  # every append now fails (IsADirectoryError)
    cache.put("2026-11-21T10", f"{0:064x}", TOTALS)
    assert cache.get("2026-11-21T10", f"{0:064x}") == TOTALS  # kept in memory
    cache.put("2026-11-21T11", f"{1:064x}", TOTALS)
    assert len(cache) == 2


def test_a_directory_that_cannot_be_used_is_a_clear_startup_error(tmp_path: Path) -> None:
    from collector.query.setup import history_cache
    from collector.startup_checks import StartupError
    from config import Settings

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    settings = Settings.model_validate({"query": {"history_cache_dir": str(blocker / "sub")}})
    with pytest.raises(StartupError, match=r"query\.history_cache_dir .*a-file/sub"):
        history_cache(settings)
    assert history_cache(Settings()) is None


def test_the_workers_of_one_collector_share_the_file(tmp_path: Path) -> None:
    first, second = (HistoryCache(tmp_path, store_name=STORE) for _ in range(2))
    first.put("2026-11-21T10", f"{0:064x}", TOTALS)
    second.put("2026-11-21T11", f"{1:064x}", TOTALS)
    first.put("2026-11-21T12", f"{2:064x}", TOTALS)
    restarted = HistoryCache(tmp_path, store_name=STORE)
    assert len(restarted) == 3
    assert restarted.get("2026-11-21T11", f"{1:064x}") == TOTALS


async def test_hours_retention_deleted_are_dropped_from_the_file(
    history: History, tmp_path: Path
) -> None:
    directory = await read_with_a_cache(history, tmp_path)
    for info in await list_hour_files(history.store, HOURS[0]):  # points retention
        await history.store.delete(info.key)
    restart(history, directory)
    assert await sealed(history) == END.start_ns
    kept = HistoryCache(directory, store_name=STORE)
    assert len(kept) == 2 and len(kept.path.read_text().splitlines()) == 2
    assert history.reads.reads == {hour.iso: 1 for hour in HOURS}  # nothing read again
