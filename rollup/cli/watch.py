"""``lm-rollup watch``: print each newly committed version as it lands.

``lm-rollup watch [--interval S] [--count N] [--json]`` reads the pointer
``rollup/v1/_latest_manifest`` once, says on stderr which version it starts from, then
polls it every ``S`` seconds with ``If-None-Match: <etag>`` (PROTOCOL §4.1): a 304 —
nothing committed — costs that one GET and carries no body. When the pointer changed,
every version since the last one printed is read back along the snapshot chain (one GET
per version, at most `MAX_BACKLOG` per poll; the first change also reads the version
before it, to tell what it added) and printed oldest first, one line each:
version, created_at, data files added/removed, batches (and rows) newly included, and
the deletes it committed (who and why, as ``history`` shows them); with
``--json`` one JSON object per line (`rollup.read.history.VersionInfo.as_row`). Versions
vacuumed before they could be read are reported on stderr, never invented.

``--count N`` stops after N versions were printed (tests, scripts); without it watch
runs until Ctrl-C, which exits 0. On exit a summary goes to stderr: polls, 304s,
changes, versions printed. A failed poll (store unavailable) is reported on stderr and
the next poll tries again: reading changes nothing, and the interval bounds the rate.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from config.settings import Settings
from protocol.clock import Clock, SystemClock
from protocol.keys import ROLLUP_POINTER_KEY
from protocol.records import RecordError, RollupPointer
from rollup.cli.read import run_with_store
from rollup.read.history import VersionInfo, describe_version
from rollup.table.commit import LoadedSnapshot, read_snapshot, walk_snapshots
from rollup.table.manifest import RollupManifestError, Snapshot
from store.base import ObjectStore, get_if_changed
from store.errors import NotFound, Unavailable

MAX_BACKLOG = 1000
"""Versions read back per poll at most; older ones are reported as skipped."""


@dataclass(slots=True)
class WatchStats:
    """What a watch did: polls sent, of which answered 304, and versions printed."""

    start_version: int = 0
    polls: int = 0
    not_modified: int = 0
    changed: int = 0
    printed: int = 0
    failed_polls: int = 0

    def summary(self) -> str:
        return (
            f"watch: {self.polls} polls, {self.not_modified} not modified (304), "
            f"{self.changed} changed, {self.failed_polls} failed; {self.printed} versions "
            f"printed since version {self.start_version}"
        )


def _pointer(body: bytes) -> RollupPointer:
    try:
        return RollupPointer.from_json(body)
    except RecordError as exc:
        raise RollupManifestError(f"{ROLLUP_POINTER_KEY}: {exc}") from None


async def new_versions(
    store: ObjectStore,
    pointer: RollupPointer,
    etag: str,
    after: int,
    note: Callable[[str], None],
) -> list[Snapshot]:
    """The snapshots after version ``after`` up to ``pointer``'s, newest first (at most
    `MAX_BACKLOG`): one GET each."""
    latest = LoadedSnapshot(
        await read_snapshot(store, pointer.manifest_key), pointer.manifest_key, etag
    )
    fresh: list[Snapshot] = []
    async for snapshot in walk_snapshots(store, latest):
        fresh.append(snapshot)
        # Stop before reading version ``after`` again (or past the backlog).
        if snapshot.version <= after + 1 or len(fresh) >= MAX_BACKLOG:
            break
    oldest = fresh[-1].version
    if oldest > after + 1:
        note(f"versions {after + 1}..{oldest - 1} were vacuumed or skipped before they were read")
    return fresh


async def _describe(
    store: ObjectStore, fresh: list[Snapshot], known: Snapshot | None
) -> list[VersionInfo]:
    """``fresh`` (newest first) described oldest first; the oldest one's predecessor is
    ``known`` when it is that version, else read (one GET; None if vacuumed)."""
    oldest = fresh[-1]
    previous = known if known is not None and known.version == oldest.version - 1 else None
    if previous is None and oldest.previous_manifest_key is not None:
        try:
            previous = await read_snapshot(store, oldest.previous_manifest_key)
        except NotFound:
            previous = None
    chain = [*fresh, previous]
    return [describe_version(s, chain[i + 1]) for i, s in enumerate(fresh)][::-1]


async def watch(
    store: ObjectStore,
    *,
    interval_s: float,
    count: int | None,
    clock: Clock,
    emit: Callable[[VersionInfo], None],
    note: Callable[[str], None],
    stats: WatchStats,
    max_polls: int | None = None,
) -> WatchStats:
    """Poll the pointer and ``emit`` each new version until ``count`` were emitted (or
    ``max_polls`` polls were sent); ``stats`` is filled in as it goes (readable after a
    Ctrl-C). Raises `RollupManifestError` for a malformed pointer or chain, store
    errors other than `Unavailable`."""
    if interval_s <= 0:
        raise ValueError(f"interval must be > 0 seconds, got {interval_s}")
    if count is not None and count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    etag: str | None = None
    try:
        body, etag = await store.get(ROLLUP_POINTER_KEY)
        stats.start_version = _pointer(body).version
    except NotFound:
        stats.start_version = 0
    note(f"watching {ROLLUP_POINTER_KEY} from version {stats.start_version}")
    last = stats.start_version
    known: Snapshot | None = None  # version ``last``, once read
    while count is None or stats.printed < count:
        if max_polls is not None and stats.polls >= max_polls:
            break
        await clock.sleep(interval_s)
        stats.polls += 1
        try:
            # Safe to repeat on the next round: a read changes nothing.
            changed = await get_if_changed(store, ROLLUP_POINTER_KEY, etag)
        except NotFound:
            continue  # nothing committed yet
        except Unavailable as exc:
            stats.failed_polls += 1
            note(f"poll failed, trying again in {interval_s:g}s: {exc}")
            continue
        if changed is None:
            stats.not_modified += 1
            continue
        stats.changed += 1
        body, etag = changed
        pointer = _pointer(body)
        if pointer.version <= last:
            continue
        fresh = await new_versions(store, pointer, etag, last, note)
        for info in await _describe(store, fresh, known):
            if count is not None and stats.printed >= count:
                break
            emit(info)
            stats.printed += 1
        last, known = pointer.version, fresh[0]
    return stats


def version_line(info: VersionInfo, as_json: bool) -> str:
    """One output line for ``info``."""
    if as_json:
        return json.dumps(info.as_row(), separators=(",", ":"))
    batches = "?" if info.batches_added is None else f"+{info.batches_added}"
    line = (
        f"version {info.version} created_at {info.created_at} files "
        f"+{info.files_added} -{info.files_removed} batches {batches} "
        f"rows +{sum(info.rows_added.values())}"
    )
    return f"{line} deletes: {'; '.join(info.deletes)}" if info.deletes else line


def run_watch(args: argparse.Namespace, settings: Settings) -> int:
    """``watch``: see the module doc."""
    stats = WatchStats()

    def emit(info: VersionInfo) -> None:
        print(version_line(info, args.json), flush=True)

    def note(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    async def work(store: ObjectStore) -> int:
        await watch(
            store,
            interval_s=args.interval,
            count=args.count,
            clock=SystemClock(),
            emit=emit,
            note=note,
            stats=stats,
        )
        return 0

    try:
        code = run_with_store(settings, work)
    except KeyboardInterrupt:
        code = 0  # Ctrl-C is how a watch without --count ends
    note(stats.summary())
    return code


def _positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def add_watch_command(subparsers: Any) -> None:
    """Add ``watch`` to ``subparsers`` (from ``add_subparsers()``)."""
    parser = subparsers.add_parser(
        "watch", help="print each newly committed version (polls with If-None-Match)"
    )
    parser.add_argument(
        "--interval",
        type=_positive(float),
        default=5.0,
        metavar="S",
        help="seconds between polls (5)",
    )
    parser.add_argument("--count", type=_positive(int), metavar="N", help="stop after N versions")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.set_defaults(handler=run_watch)
