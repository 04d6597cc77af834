"""``lm-reconciler enable-bundles [--dry-run] [--json]`` (PROTOCOL §3.10 "Writing"), and the
reconciler's own place in the version registry (`reconciler_registered`).

The command writes ``index/v1/features.json`` with ``bundles: true`` only while

(a) no unexpired version entry lacks ``reads_bundles`` (an unreadable entry blocks too);
(b) every index-log writer seen within ``reconciler.segment_retention_s`` has a collector
    entry that reads bundles: the writers are the ``<writer-id>`` of the segment names
    listed from ``now - segment_retention_s`` (`keys.index_log_start_after`: segment names
    sort by cut time, so the listing is the retained window, never older history; the
    log's retention deletes what is older);
(c) the reconciler lease's holder (if a lease record exists) has an entry that reads
    bundles, unexpired while its lease is.

Otherwise it exits 1 naming each blocking process and writer. It is idempotent (a record
that already says ``bundles: true`` is left as it is), and ``--dry-run`` checks and says
what blocks without writing. The record is written with ``If-None-Match: *`` (or
``If-Match`` on the one read), so two operators never overwrite each other's record.

Requests: one GET of the record, one GET of the lease, the registry (one LIST, one GET per
entry), the log listing of the retention window (one LIST page per 1,000 segments, no
GET), and one PUT. A process of an older version, which registers nothing, that starts
after the check is outside what the checks can see (PROTOCOL's gate closes it by (b) for
collectors that wrote within the retention only); so is a version entry written between
the checks and the PUT.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field

from config import Settings
from index.features import BundleGate, FeatureReader, UnknownFeature, registered, unimplemented
from index.versions import NS_PER_S, Registry, read_registry, reconciler_process_id
from protocol import keys
from protocol.clock import Clock, SystemClock
from protocol.records import FeatureRecord, LeaseRecord, RecordError
from reconciler.retractions import operator_name
from store.base import ObjectStore
from store.errors import NotFound, PreconditionFailed
from store.time import store_clock

EXIT_OK, EXIT_REFUSED = 0, 1


@dataclass
class EnableResult:
    bundles: bool
    """The store's feature record says ``bundles: true`` (now, or already)."""
    written: bool = False
    dry_run: bool = False
    blocking: list[str] = field(default_factory=list)
    entries: int = 0
    log_writers: int = 0
    segments_listed: int = 0
    lease_holder: str | None = None


async def enable_bundles(
    store: ObjectStore, clock: Clock, settings: Settings, *, by: str, dry_run: bool
) -> EnableResult:
    """Check (a)-(c) and write the feature record when nothing blocks (module doc).
    Raises `UnknownFeature` (the record turns on a feature this version lacks),
    `index.features.FeatureRecordError` and store errors."""
    store_time = store_clock(store, clock)
    reader = FeatureReader(store)
    record = await reader.read()
    if names := unimplemented(record):
        raise UnknownFeature(names)
    if record is not None and record.bundles:
        return EnableResult(bundles=True, dry_run=dry_run)
    registry = await read_registry(store, store_time)
    result = EnableResult(bundles=False, dry_run=dry_run, entries=len(registry.entries))
    for entry in registry.lacking_reads_bundles():
        why = (
            f"unreadable ({entry.error})"
            if entry.entry is None
            else f"version {entry.entry.version!r} does not read bundles"
        )
        result.blocking.append(f"process {entry.key}: {why}, unexpired")
    writers = await _recent_log_writers(store, store_time.now_ns(), settings, result)
    registered_writers = registry.collector_writers()
    for writer, segment in sorted(writers.items()):
        if writer not in registered_writers:
            result.blocking.append(
                f"index log writer {writer!r} (newest segment {segment}) has no version "
                f"entry {keys.version_entry_key('collector', writer)} that reads bundles: "
                "upgrade it, or wait until its segments are past reconciler.segment_retention_s"
            )
    await _check_lease_holder(store, registry, result)
    if result.blocking or dry_run:
        return result
    written = FeatureRecord(
        bundles=True, written_by=by[:256] or "unknown", written_at_unix_ns=store_time.now_ns()
    )
    try:
        if reader.etag is None:
            await store.put(keys.INDEX_FEATURES_KEY, written.to_json(), if_none_match=True)
        else:
            extra = record.model_extra if record is not None else None
            body = FeatureRecord.model_validate({**(extra or {}), **written.model_dump()})
            await store.put(keys.INDEX_FEATURES_KEY, body.to_json(), if_match=reader.etag)
    except PreconditionFailed:
        # Someone wrote the record since we read it: its answer is the store's now.
        again = await FeatureReader(store).read()
        if names := unimplemented(again):
            raise UnknownFeature(names) from None
        result.bundles = again is not None and again.bundles
        if not result.bundles:
            result.blocking.append(f"{keys.INDEX_FEATURES_KEY} changed meanwhile: run it again")
        return result
    result.bundles = result.written = True
    return result


async def _recent_log_writers(
    store: ObjectStore, now_ns: int, settings: Settings, result: EnableResult
) -> dict[str, str]:
    """Each writer id of the segments whose cut time lies within the retention, with its
    newest segment's key."""
    since_ns = max(0, now_ns - int(settings.reconciler.segment_retention_s * NS_PER_S))
    writers: dict[str, str] = {}
    start_after = keys.index_log_start_after(since_ns)
    async for info in store.list(keys.INDEX_LOG_PREFIX, start_after=start_after):
        result.segments_listed += 1
        try:
            name = keys.parse_index_log_segment_key(info.key)
        except keys.KeyFormatError:
            continue  # not a segment (an operator's file)
        writers[name.writer_id] = info.key
    result.log_writers = len(writers)
    return writers


async def _check_lease_holder(store: ObjectStore, registry: Registry, result: EnableResult) -> None:
    try:
        body, _etag = await store.get(keys.RECONCILER_LEASE_KEY)
    except NotFound:
        return  # no reconciler has run: none holds a lease
    try:
        lease = LeaseRecord.from_json(body)
    except RecordError as exc:
        result.blocking.append(f"reconciler lease {keys.RECONCILER_LEASE_KEY}: {exc}")
        return
    result.lease_holder = lease.owner
    found = registry.of_role("reconciler", reconciler_process_id(lease.owner))
    entry = found.entry if found is not None else None
    lease_live = lease.expires_at_unix_ns > registry.now_ns
    if (
        entry is None
        or not entry.reads_bundles
        or (lease_live and entry.expires_at_unix_ns <= registry.now_ns)
    ):
        result.blocking.append(
            f"reconciler lease holder {lease.owner!r} (epoch {lease.epoch}) has no "
            f"{'unexpired ' if lease_live else ''}version entry "
            f"{keys.version_entry_key('reconciler', reconciler_process_id(lease.owner))} "
            "that reads bundles"
        )


# --- the reconciler's registration and the CLI ----------------------------------------------


@asynccontextmanager
async def reconciler_registered(
    store: ObjectStore, owner: str, *, daemon: bool
) -> AsyncIterator[BundleGate]:
    """The reconciler's version entry, named by its lease owner (check (c)), for the block:
    `UnknownFeature` before it takes any lease (``daemon``: `index.features.registered`)."""
    pid = reconciler_process_id(owner)
    async with registered(
        store, SystemClock(), role="reconciler", process_id=pid, daemon=daemon
    ) as gate:
        yield gate


def add_enable_bundles_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    enable = commands.add_parser(
        "enable-bundles", help="turn bundles on (PROTOCOL §3.10) once every process reads them"
    )
    enable.add_argument("--dry-run", action="store_true", help="say what blocks, write nothing")
    enable.add_argument("--json", action="store_true")
    enable.add_argument("--by", help="who enables (default: the OS user and host)")


async def enable_bundles_command(
    store: ObjectStore, settings: Settings, args: argparse.Namespace
) -> int:
    """Run the command; print the outcome (stdout) or what blocks (stderr)."""
    by = args.by or f"{operator_name()}@{socket.gethostname()}"
    try:
        result = await enable_bundles(store, SystemClock(), settings, by=by, dry_run=args.dry_run)
    except UnknownFeature as exc:
        print(f"lm-reconciler: enable-bundles refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if args.json:
        print(json.dumps(asdict(result)))
    elif result.bundles:
        print("bundles: on" + (" (written now)" if result.written else " (already)"))
    elif not result.blocking:
        print(
            f"bundles: off; nothing blocks ({_counts(result)}): enable-bundles would turn them on"
        )
    for blocker in result.blocking:
        print(f"blocking: {blocker}", file=sys.stderr)
    if result.blocking:
        print(f"lm-reconciler: enable-bundles refused ({_counts(result)})", file=sys.stderr)
    return EXIT_OK if not result.blocking else EXIT_REFUSED


def _counts(result: EnableResult) -> str:
    return (
        f"{result.entries} version entries, {result.log_writers} log writers in "
        f"{result.segments_listed} segments within the retention"
    )
