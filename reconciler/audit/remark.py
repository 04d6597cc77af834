"""Work markers for the catalog files a killed audit run left without one (PROTOCOL §3.7:
every catalog file has a marker naming it).

`reconciler.cataloger.Cataloger.commit` writes a catalog file, then its rollup work
marker. A run killed between the two leaves a file whose rows the resumed audit sees as
cataloged (it joins every catalog file there is), so nothing would mark it again, and the
rollup would never count those batches (`lm-chaos` ``kill`` found it: 32 batches, one act
chunk, "neither rolled up nor in a file a work marker names"). A new audit started after
that run (its pin lapsed) joins the file as cataloged too. So whenever the newest audit
was left ``running``, before it is resumed or a new one starts
(`reconciler.audit.records.resume_or_start`), the marker of every catalog file that audit
created since it started and that still exists is created if absent: its
``index/v1/catalog-created/`` entries from the audit's recorded position whose writer is
``audit-<its id>`` (`records.CatalogCreated.writer`), and those without a writer (written
before entries named one: any of them may be the audit's).

The other files created meanwhile are not touched: their writers mark them before they
move on, and a crash of theirs between file and marker leaves rows that a marked file
holds (the steady pass catalogs the segment again, its checkpoint not moved; a merged
file's rows are its inputs', marked when those were written). A rollup run may since
have consumed their markers, and bringing those back would only make it redo work. A
marker the rollup already consumed comes back only for the audit's own files (and
unnamed ones); the rollup then finds every row of that file in its ledger and removes it
again (it never counts a batch twice). Cost, only after an audit was left running: per catalog file created since
it started, one GET of its entry; per file of that audit, a HEAD and a conditional PUT.
"""

from __future__ import annotations

from protocol import keys
from protocol.records import AuditRecord, CatalogCreated, RecordError, RollupWorkMarker
from reconciler import store_calls
from reconciler.context import ReconcilerContext
from reconciler.gc.catalog_since import entries_since
from store.errors import NotFound


def written_by(created: CatalogCreated, audit_id: str) -> bool:
    """Whether the entry's file may be one the audit ``audit_id`` wrote: its writer says so,
    or the entry names none (written before entries did)."""
    return created.writer is None or created.writer == CatalogCreated.audit_writer(audit_id)


async def remark_since(ctx: ReconcilerContext, audit: AuditRecord) -> int:
    """Create the missing markers of the catalog files ``audit`` created from its recorded
    position on (see module); returns how many entries were looked at."""
    if audit.catalog_created_from is None:
        return 0
    entries = await entries_since(ctx.store, audit.catalog_created_from)
    for entry in entries:
        try:
            body, _etag = await ctx.store.get(entry)
            created = CatalogCreated.from_json(body)
            if not written_by(created, audit.audit_id):
                continue  # the steady pass's, compaction's or a retraction's: marked by them
            hour = keys.parse_index_catalog_key(created.catalog_key)[0]
            await ctx.store.head(created.catalog_key)
        except (NotFound, RecordError, keys.KeyFormatError):
            continue  # trimmed, unreadable (the GC reports those), or compacted away
        marker = RollupWorkMarker(
            catalog_key=created.catalog_key,
            hour=hour.iso,
            rows=created.rows,
            written_at_unix_ns=ctx.clock.now_ns(),
        )
        await ctx.check_fence()
        await store_calls.create_if_absent(
            ctx, keys.rollup_work_marker_key(created.catalog_key), marker.to_json()
        )
    return len(entries)
