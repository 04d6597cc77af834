"""Sealed catalog hours' totals kept on local disk (``query.history_cache_dir``), so a
restarted query collector reads again only the hours whose catalog changed
(`collector.query.coverage`). Without it, every start reads every sealed hour once: ~11 s
for a settled hour of 3.6 million batches on a quiet 2-core machine, ~2 hours for 30 days
at 1,000 batches/s (and every catalog file of the history fetched once more).

**Why a listing names the totals.** Catalog files are immutable and every write has a
name of its own (PROTOCOL §3.7: ``<epoch>-<sequence>``); a file is deleted only once its
rows are in another file written after it (compaction), or with its whole hour. So an
hour listed with exactly the files (key, ETag, size) it was listed with when its totals
were read holds the same rows, and has the same totals. The listing is the one the
history reader makes anyway (one LIST page per 1,000 files); a restart on an unchanged
history makes no other request. Totals read after their listing are still those of that
listing whenever it is seen again: a file written or deleted in between is in, or
missing from, every later listing, so that listing is never seen again.

**File.** ``<dir>/sealed-hours-<store>.jsonl``, ``<store>`` a digest of the store's URL
and endpoint (another store's hours are another file; the ETags tell a bucket created
again under the same name apart). A line per hour read: its listing's SHA-256, its
totals, and a SHA-256 of both: a torn or altered line is not trusted (the hour is read
from the store). Appended, not fsync'd (lost lines are read again); the last line of an
hour counts. The workers of one collector share the file: a line is one ``write`` in
append mode, and a rewrite goes through a temporary file of the process's own.

**Bounded**: a line per sealed hour the catalog still holds (~250 bytes; a year of hours
~2 MB). Hours before the catalog's first (deleted by retention) are dropped when the
reader first lists it, and at start a file holding more than twice the lines it needs
is rewritten (temporary file, rename). A disk that fails a write turns the cache off for
the process (logged once); the reader goes on from the store.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import structlog

from rollup.table.manifest import LedgerHour
from store.base import ObjectInfo

log = structlog.get_logger("collector.query.history_cache")


def listing_digest(files: Sequence[ObjectInfo]) -> str:
    """SHA-256 of an hour's catalog files as listed (key, ETag, size; in key order)."""
    lines = sorted(f"{f.key}\t{f.etag}\t{f.size}\n" for f in files)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def _check(hour: str, listing: str, totals: LedgerHour) -> str:
    text = f"{hour}\n{listing}\n{totals.batches}\n{totals.records}\n{totals.setsum}"
    return hashlib.sha256(text.encode()).hexdigest()


class HistoryCache:
    def __init__(self, directory: Path, *, store_name: str) -> None:
        """Raises `OSError` when ``directory`` cannot be made or its file read."""
        directory.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256(store_name.encode()).hexdigest()[:16]
        self.path = directory / f"sealed-hours-{digest}.jsonl"
        self._hours: dict[str, tuple[str, LedgerHour]] = {}
        self._lines = 0
        self._on = True
        torn = False
        if self.path.exists():
            torn = self._load()
        if torn or self._lines > 2 * len(self._hours) + 64:
            self._rewrite()

    def __len__(self) -> int:
        return len(self._hours)

    def get(self, hour: str, listing: str) -> LedgerHour | None:
        """The totals of ``hour`` read with this listing (`listing_digest`), if kept."""
        found = self._hours.get(hour)
        return found[1] if found is not None and found[0] == listing else None

    def put(self, hour: str, listing: str, totals: LedgerHour) -> None:
        self._hours[hour] = (listing, totals)
        if not self._on:
            return
        try:
            with self.path.open("a", encoding="utf-8") as out:
                out.write(_line(hour, listing, totals))
            self._lines += 1
        except OSError as exc:
            self._turn_off(exc)

    def forget_before(self, hour: str) -> None:
        """Drop the hours before ``hour``, the first hour the catalog holds (retention
        deleted the rest): the file is rewritten when any was kept."""
        gone = [kept for kept in self._hours if kept < hour]
        for kept in gone:
            del self._hours[kept]
        if gone and self._on:
            try:
                self._rewrite()
            except OSError as exc:
                self._turn_off(exc)

    def _turn_off(self, exc: OSError) -> None:
        """The disk failed a write: keep no more for this process (the reader goes on from
        the store)."""
        self._on = False
        log.warning("history_cache_off", path=str(self.path), error=str(exc))

    def _load(self) -> bool:
        """Read the kept hours; whether the last line is torn (the next append must not
        run on from it)."""
        text = ""
        with self.path.open(encoding="utf-8", errors="replace") as lines:
            for text in lines:
                self._lines += 1
                try:
                    item = json.loads(text)
                    hour, listing = str(item["hour"]), str(item["listing"])
                    totals = LedgerHour(
                        int(item["batches"]), int(item["records"]), str(item["setsum"])
                    )
                    trusted = item["check"] == _check(hour, listing, totals)
                except (ValueError, KeyError, TypeError):
                    trusted = False
                if trusted:
                    self._hours[hour] = (listing, totals)
        log.info("history_cache_loaded", path=str(self.path), hours=len(self._hours))
        return bool(text) and not text.endswith("\n")

    def _rewrite(self) -> None:
        fresh = self.path.with_suffix(f".{os.getpid()}.tmp")  # workers may share the file
        with fresh.open("w", encoding="utf-8") as out:
            for hour, (listing, totals) in sorted(self._hours.items()):
                out.write(_line(hour, listing, totals))
            out.flush()
            os.fsync(out.fileno())
        fresh.replace(self.path)
        self._lines = len(self._hours)


def _line(hour: str, listing: str, totals: LedgerHour) -> str:
    item = {
        "hour": hour,
        "listing": listing,
        "batches": totals.batches,
        "records": totals.records,
        "setsum": totals.setsum,
        "check": _check(hour, listing, totals),
    }
    return json.dumps(item, separators=(",", ":")) + "\n"
