"""Publishing committed rollup snapshots as Apache Iceberg tables (PROTOCOL §4.1).

After a commit (and at every run, to repair), `publish` writes, for each table and each
committed version not yet published, the Iceberg metadata built by
`rollup.iceberg.metadata` under ``rollup/v1/iceberg/<table>/metadata/`` (Hadoop-table
layout: engines open the table directory, or a ``v<N>.metadata.json`` directly):

1. the manifest and manifest-list Avro files, at names unique to the attempt
   (If-None-Match);
2. ``v<N>.metadata.json``, created with If-None-Match: the publish point of version N. If
   it exists already, an earlier attempt published N (its answer or the hint update was
   lost): it is read and used as the base of N+1;
3. ``version-hint.text`` = N, swapped with If-Match on the ETag read before (created
   with If-None-Match), so it only ever moves forward from what this publisher saw.

The rollup pointer stays the commit point: a crash between the commit and its publish
leaves the hint behind the pointer, and the next `publish` (every run calls it) writes
every version after the hint, in order, reading the rollup chain back to it. The first
publish of a dataset publishes only the latest version. Orphan Avro files of a crashed
attempt are never referenced; they are left in place (vacuum does not sweep
``iceberg/`` yet).

Vacuum keeps every rollup version whose Iceberg snapshot the current metadata of any
table still lists (`published_versions`), so files of unexpired published snapshots stay.
"""

from __future__ import annotations

import json

import structlog
from pyiceberg.table.metadata import TableMetadata

from protocol import keys
from rollup.iceberg.deletes import position_deletes
from rollup.iceberg.metadata import publish_version
from rollup.iceberg.schema import new_table, parse_metadata
from rollup.table import schemas
from rollup.table.commit import LoadedSnapshot, load_latest, walk_snapshots
from rollup.table.manifest import Snapshot
from rollup.table.owner import OwnerLease, OwnerLost
from rollup.table.storage import engine_url
from store.base import ObjectStore
from store.errors import NotFound, PreconditionFailed, StoreError

log = structlog.get_logger(__name__)


class PublishConflict(Exception):
    """Another publisher moved ``version-hint.text`` first; the next run repairs."""


def table_url(store_url: str, table: str) -> str:
    """The absolute location of ``table``'s Iceberg table directory."""
    metadata_dir = keys.rollup_iceberg_file_key(table, "x").rsplit("/", 2)[0]
    return engine_url(store_url, metadata_dir)


async def read_hint(store: ObjectStore, table: str) -> tuple[int, str] | None:
    """``(published version, ETag)`` of ``table``'s hint, or None before the first publish."""
    try:
        body, etag = await store.get(keys.rollup_iceberg_version_hint_key(table))
    except NotFound:
        return None
    try:
        return int(body.decode().strip()), etag
    except ValueError:
        raise ValueError(f"{keys.rollup_iceberg_version_hint_key(table)}: not a version") from None


async def published_versions(store: ObjectStore) -> set[int]:
    """Rollup versions that the current Iceberg metadata of some table still lists: one
    GET of the hint and one of the metadata per table."""
    versions: set[int] = set()
    for table in schemas.TABLES:
        hint = await read_hint(store, table)
        if hint is None:
            continue
        body, _ = await store.get(keys.rollup_iceberg_metadata_key(table, hint[0]))
        versions.update(int(s["snapshot-id"]) for s in json.loads(body).get("snapshots", []))
    return versions


async def publish(
    store: ObjectStore,
    *,
    store_url: str,
    retention_s: float,
    latest: LoadedSnapshot | None = None,
    owner: OwnerLease | None = None,
) -> list[int]:
    """Publish every committed version after each table's hint (only the latest on a
    first publish). Returns the versions published (for any table), ascending. Raises
    `PublishConflict`, `OwnerLost`, store errors; what was published stays published."""
    latest = latest if latest is not None else await load_latest(store)
    if latest is None:
        return []
    hints = {table: await read_hint(store, table) for table in schemas.TABLES}
    newest = latest.snapshot.version
    floor = min(h[0] if h is not None else newest - 1 for h in hints.values())
    if floor >= newest:
        return []
    chain: list[Snapshot] = []
    async for snapshot in walk_snapshots(store, latest):
        if snapshot.version <= floor:
            break
        chain.append(snapshot)
    chain.reverse()
    done: set[int] = set()
    for table, hint in hints.items():
        base = await _base(store, store_url, table, hint)
        etag = hint[1] if hint is not None else None
        for snapshot in chain:
            if hint is not None and snapshot.version <= hint[0]:
                continue
            if owner is not None:
                await owner.check()
            base = await _publish_one(store, store_url, table, base, snapshot, retention_s)
            etag = await _move_hint(store, table, snapshot.version, etag)
            done.add(snapshot.version)
    if done:
        log.info("rollup_iceberg_published", versions=sorted(done))
    return sorted(done)


async def publish_or_log(
    store: ObjectStore, *, store_url: str, retention_s: float, owner: OwnerLease | None = None
) -> list[int]:
    """`publish` for the end of a rollup run: the run's commit has landed whatever happens
    here, so a failure is logged (``rollup_iceberg_publish_failed``) and the next run
    repairs it. Returns the versions published (none on failure)."""
    try:
        return await publish(store, store_url=store_url, retention_s=retention_s, owner=owner)
    except (StoreError, PublishConflict, OwnerLost, ValueError, OSError) as exc:
        log.warning("rollup_iceberg_publish_failed", error=f"{type(exc).__name__}: {exc}")
        return []


async def _base(
    store: ObjectStore, store_url: str, table: str, hint: tuple[int, str] | None
) -> TableMetadata:
    if hint is None:
        return new_table(table, table_url(store_url, table))
    body, _ = await store.get(keys.rollup_iceberg_metadata_key(table, hint[0]))
    return parse_metadata(body)


async def _publish_one(
    store: ObjectStore,
    store_url: str,
    table: str,
    base: TableMetadata,
    snapshot: Snapshot,
    retention_s: float,
) -> TableMetadata:
    data_url_of = lambda path: engine_url(store_url, path)  # noqa: E731
    published = publish_version(
        base,
        snapshot,
        table,
        key_of=lambda name: keys.rollup_iceberg_file_key(table, name),
        url_of=lambda key: engine_url(store_url, key),
        data_url_of=data_url_of,
        retention_s=retention_s,
        deletes=await position_deletes(store, snapshot, table, data_url_of),
    )
    for written in published.avro_files:
        await store.put(written.key, written.body, if_none_match=True)
    key = keys.rollup_iceberg_metadata_key(table, snapshot.version)
    try:
        await store.put(key, published.metadata_body, if_none_match=True)
    except PreconditionFailed:
        # An earlier attempt published this version; its metadata is the truth.
        body, _ = await store.get(key)
        return parse_metadata(body)
    return published.metadata


async def _move_hint(store: ObjectStore, table: str, version: int, etag: str | None) -> str:
    key = keys.rollup_iceberg_version_hint_key(table)
    body = str(version).encode()
    try:
        if etag is None:
            return await store.put(key, body, if_none_match=True)
        return await store.put(key, body, if_match=etag)
    except PreconditionFailed:
        raise PublishConflict(f"{key} moved while publishing version {version}") from None
