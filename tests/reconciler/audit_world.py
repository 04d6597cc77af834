"""A store with one of everything a full audit finds, and what an audit left in it: the
worlds the Spark engine's tests audit with both engines and compare (issue 23 item 3).

`build_world`: 8 batches of 2 agents and an identity conflict; 5 batches logged and
cataloged by a steady pass, the rest (and the quarantine record) only in the store; a
wrong hash cataloged over a true row (two hashes: read, superseded, a catalog-mismatch);
a row for a manifest never created (a phantom, and its blob missing), and another that an
operator retracted (its retracted row written, issue 31 item 5); a cataloged batch whose blob is gone (a
missing blob); an unreferenced blob (an orphan once older than the retry horizon); a
catalog file that is not an index file (moved aside, its rows cataloged again).

`inventory_rows`: the world as an S3 Inventory report's rows, some records without a
LastModified (a report may lack the column: such a record counts as old in both engines,
PROTOCOL §3.9, issue 31 item 4).

`audit_outcome`: what an audit decided, engine-independent: every key's catalog row that
counts (fields, not file names; `index.catalog_tables`, the index's one rule), the orphan file, the problem records, the catalog files
moved aside."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

from index import catalog
from index.catalog_tables import read_hour_table
from index.rows import accepted_row, rows_of
from protocol import keys
from protocol.records import AuditRecord
from reconciler.audit.orphans import decode_orphans
from reconciler.context import ReconcilerContext
from reconciler.problems import list_problems
from reconciler.retractions import retract
from reconciler.steady import SteadyScanner
from store.base import ObjectStore
from tests.reconciler.conftest import (
    T0_NS,
    Batch,
    keys_under,
    log_rows,
    make_batch,
    write_batches,
    write_conflict,
)

WRONG_SHA = hashlib.sha256(b"not the frame this manifest names").hexdigest()
ORPHAN = b"a blob no record names"


@dataclasses.dataclass(frozen=True)
class World:
    batches: list[Batch]
    quarantine_key: str
    wrong_hash: Batch
    phantom: Batch
    retracted: Batch
    """A phantom an operator retracted before the audit."""
    blob_gone: Batch
    orphan_sha: str
    broken_file: str


async def build_world(store: ObjectStore, ctx: ReconcilerContext) -> World:
    batches = await write_batches(store, agents=2, per_agent=4)
    conflict = await write_conflict(store, batches[0], T0_NS + 5 * keys.NS_PER_S)
    await log_rows(store, ctx.clock, batches[:5])
    await SteadyScanner(ctx).run_pass()
    [steady_file] = await keys_under(store, keys.INDEX_CATALOG_PREFIX)
    wrong = batches[1]
    etag = (await store.head(wrong.key)).etag
    row = dataclasses.replace(
        accepted_row(wrong.manifest, etag=etag),
        frame_sha256=WRONG_SHA,
        raw_blob_key=keys.raw_blob_key(WRONG_SHA),
        source="index/v1/log/buggy-segment.parquet",
    )
    await ctx.catalog_writer.write(row.hour, [row], writer="steady")
    never = make_batch(7, 0, T0_NS)  # logged, but its manifest was never created
    phantom = accepted_row(never.manifest, etag='"abc"')
    await ctx.catalog_writer.write(phantom.hour, [phantom], writer="steady")
    # Another phantom, which an operator retracted: the audit writes its retracted row.
    retracted_batch = make_batch(8, 0, T0_NS)
    retracted = accepted_row(retracted_batch.manifest, etag='"abd"')
    await ctx.catalog_writer.write(retracted.hour, [retracted], writer="steady")
    await retract(store, ctx.clock, retracted.key, reason="no manifest", by="test")
    gone = batches[2]
    await store.delete(keys.raw_blob_key(gone.sha))
    orphan_sha = hashlib.sha256(ORPHAN).hexdigest()
    await store.put(keys.raw_blob_key(orphan_sha), ORPHAN)
    # The steady pass's file turns unreadable: its 5 batches are cataloged again.
    await store.put(steady_file, b"PAR1 garbage where a catalog file was")
    return World(
        batches,
        conflict.quarantine_key,
        wrong,
        never,
        retracted_batch,
        gone,
        orphan_sha,
        steady_file,
    )


def undated_records(world: World) -> set[str]:
    """The records `inventory_rows` reports without a LastModified: the quarantine record
    and every other batch's manifest (cataloged ones, one cataloged with a wrong hash, and
    ones never logged); the others keep theirs."""
    return {world.quarantine_key, *(b.key for b in world.batches[1::2])}


async def inventory_rows(
    store: ObjectStore, world: World, prefix: str
) -> list[tuple[str, int, int | None]]:
    """``(bucket key with prefix, size, last modified ms or None)`` of every object in
    ``store`` (as `tests.reconciler.test_inventory.store_rows`), None for the
    `undated_records`."""
    undated = undated_records(world)
    return [
        (
            prefix + info.key,
            info.size,
            None if info.key in undated else info.last_modified_ns // 1_000_000,
        )
        async for info in store.list("")
    ]


CATALOG_FILE_NAME = re.compile(r"\d{10}-\d{10}\.parquet$")


def without_file_name(key: str) -> str:
    """``key`` with a catalog file's ``<epoch>-<sequence>`` name replaced: two copies of a
    world built a second apart name their files apart (the sequence starts at the clock's
    second), and the outcome is the same."""
    return CATALOG_FILE_NAME.sub("<file>.parquet", key)


async def audit_outcome(store: ObjectStore, record: AuditRecord) -> dict[str, Any]:
    hours = {
        keys.parse_index_catalog_key(info.key)[0] async for info in catalog.list_all_files(store)
    }
    newest: dict[str, tuple[Any, ...]] = {}
    for hour in sorted(hours, key=lambda h: h.start_ns):
        for row in rows_of((await read_hour_table(store, hour)).table):  # the index's rule
            newest[row.key] = (
                row.kind,
                row.frame_sha256,
                row.accepted_frame_sha256,
                row.time_unix_ns,
                row.etag,
                row.source,
            )
    body, _etag = await store.get(
        keys.audit_orphans_key(record.started_at_unix_ns, record.audit_id)
    )
    orphans = {sha: (size, raw) for sha, (size, _modified, raw) in decode_orphans(body).items()}
    problems = sorted(
        [
            (r.kind, without_file_name(r.subject_key))
            async for _key, r in list_problems(store)
            if r is not None
        ]
    )
    return {
        "rows": newest,
        "orphans": orphans,
        "problems": problems,
        "aside": sorted(
            map(without_file_name, await keys_under(store, keys.INDEX_UNREADABLE_PREFIX))
        ),
        "counts": (record.manifests_seen, record.quarantines_seen, record.cataloged),
    }
