"""Acting on the blob join's results (``blobs.parquet``, ``referencing.parquet``:
`reconciler.audit.engines.sql.BLOB_JOIN`), PROTOCOL §3.5, §3.7.

Raw objects are frame blobs and bundles, joined by key (PROTOCOL §3.7, §3.10).

- **Missing blobs**: a referenced raw key the listing lacked (and that no retired row
  references) is HEADed (`confirm_missing`: an object created after the listing passed its
  key is not missing), then the record the join names as referencing it is read
  (`supersede_for_missing`): if the store's record names another raw object, the catalog
  row was wrong (a log row with a wrong hash or raw key whose ETag was right, which the
  record join cannot see) — the store's record is written as a superseding row (a
  ``catalog-mismatch``), the key is not missing, and the objects that record references
  are no orphans. A wrong hash that names a blob which exists is not seen by the audit
  (the steady pass's read-backs and sample catch it; the GC's targeted proof reads the
  manifest before deleting its blob). The rest become ``missing-blob`` problems
  (`record_missing_blobs`), resolved when seen again.
- **Orphans** (listed, referenced by no live row, older than the retry horizon in store
  time; ``raw_retention`` when only retired rows reference them) go to the audit's orphan
  file (`reconciler.audit.orphans`), written by either engine's
  `reconciler.audit.engines.duckdb_joins.ResultFiles.write_orphans`.
- **Bad ranges** (``bad_ranges.parquet``): a row whose range ends past its bundle's listed
  size is a ``bad-range`` problem on the bundle (`record_bad_ranges`; no GET). It is not
  resolved here: the bundle and the record never change (a retraction of the record is
  the way out), and readers record ``bad-range`` for ranges that fit but hold no frame.
"""

from __future__ import annotations

from index.rows import IndexRow
from protocol import keys
from reconciler.audit.engines.duckdb_joins import JoinResults, iter_batches
from reconciler.audit.engines.duckdb_queries import NewestRow
from reconciler.audit.engines.engine import EngineJoins
from reconciler.audit.records_act import Newest, RecordActs, etag_differs, fields_differ
from reconciler.cataloger import CatalogBatch, Cataloger
from reconciler.context import ReconcilerContext
from reconciler.problems import ProblemBook
from rollup.read.lost import acknowledged_shas
from store.base import ObjectStore
from store.errors import NotFound
from store.etag_check import normalized_etag


async def confirm_missing(ctx: ReconcilerContext, results: JoinResults) -> dict[str, str]:
    """The missing-blob candidates (raw keys) a HEAD does not find either, each with a
    record that references it (normally none: held in memory)."""
    candidates: list[tuple[str, str]] = []
    for batch in iter_batches(results.referencing):
        candidates.extend(
            zip(
                batch.column("raw_key").to_pylist(),
                batch.column("record_key").to_pylist(),
                strict=True,
            )
        )
    # HEADed in raw-key order: the engines write the file in no defined order (DuckDB's
    # threads with preserve_insertion_order off, Spark's partitions), and the requests'
    # order must not depend on a thread's timing (a seeded simulation replays them).
    missing: dict[str, str] = {}
    for raw_key, record_key in sorted(candidates):
        try:
            await ctx.store.head(raw_key)
        except NotFound:
            missing[raw_key] = record_key
    return missing


async def supersede_for_missing(
    acts: RecordActs, cataloger: Cataloger, joins: EngineJoins, missing: dict[str, str]
) -> tuple[CatalogBatch, list[str]]:
    """The rows to write for missing raw objects whose record names another one (see
    module), and the keys whose mismatch their write resolves; ``missing`` is updated in
    place."""
    if not missing:
        return CatalogBatch(), []
    batch = await cataloger.read(sorted(set(missing.values())), source="audit")
    wrong_of: dict[str, list[str]] = {}
    for row in batch.rows:
        wrong = [raw for raw, key in missing.items() if key == row.key]
        wrong = [raw for raw in wrong if raw not in row.referenced_raw_keys]
        if wrong:
            wrong_of[row.key] = wrong
    newest = joins.newest_rows(sorted(wrong_of))
    rows: list[IndexRow] = []
    for row in batch.rows:
        found = wrong_of.get(row.key)
        if not found:
            continue  # the record names that blob: it is missing indeed
        for raw_key in found:
            del missing[raw_key]  # only a stale or wrong row references it
        if row.key in acts.written or _is_newest(row, newest.get(row.key)):
            continue  # an older row of the key, superseded already (compaction drops it)
        rows.append(row)
        acts.written.add(row.key)
        await acts.mismatch(row, [f"raw object (the catalog's {found[0]} does not exist)"])
    return CatalogBatch(rows=rows), [row.key for row in rows]


def _is_newest(row: IndexRow, newest: NewestRow | None) -> bool:
    if newest is None:
        return False
    etag, sha, accepted, time_ns, raw_key, offset, length = newest
    found = Newest(
        normalized_etag(etag), sha, accepted, time_ns, conflict=False, raw=(raw_key, offset, length)
    )
    return not (fields_differ(row, found) or etag_differs(row, found))


async def record_missing_blobs(
    store: ObjectStore, problems: ProblemBook, missing: dict[str, str]
) -> int:
    """Record a ``missing-blob`` problem per raw key of ``missing`` (with a record that
    references it), except the frame blobs of frames an operator acknowledged as lost
    (`rollup.lifecycle.lost`: settled); resolve the open ones no longer missing. Returns
    how many."""
    if missing:
        for sha in await acknowledged_shas(store):
            missing.pop(keys.raw_blob_key(sha), None)
    for raw_key, record_key in sorted(missing.items()):
        await problems.record(
            "missing-blob", raw_key, f"raw object does not exist; referenced by {record_key}"
        )
    async for subject in problems.subjects("missing-blob"):
        if subject not in missing:
            await problems.resolve("missing-blob", subject)
    return len(missing)


async def record_bad_ranges(problems: ProblemBook, results: JoinResults) -> int:
    """A ``bad-range`` problem per bundle of ``bad_ranges.parquet`` (see module); how many
    ranges (normally none)."""
    count = 0
    for batch in iter_batches(results.bad_ranges):
        for found in batch.to_pylist():
            count += 1
            await problems.record(
                "bad-range",
                str(found["raw_key"]),
                f"the audit found {found['record_key']} naming range "
                f"[{found['raw_offset']}, +{found['raw_length']}), past the bundle's listed "
                f"size {found['size']} less its index entry and footer",
            )
    return count


def blob_counts(joins: EngineJoins, results: JoinResults) -> dict[str, int]:
    """The audit record's bundle figures (`protocol.records.AuditRecord.bundles_listed`,
    ``bundle_bytes``, ``bundle_dead_bytes``, ``bundle_pinned_bytes``) from
    ``bundles.parquet``; blocking (a query over the result file)."""
    return joins.bundle_totals(results)
