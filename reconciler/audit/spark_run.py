"""A full audit with ``reconciler.audit_engine = "spark"`` (PROTOCOL §3.9): the lease holder
(this process, the Spark driver) records the audit's start and pins the catalog
(`reconciler.audit.records.resume_or_start`, as the local engine), the executors list the
ranges (`reconciler.audit.spark_listing`), the joins run in Spark SQL over the listing
parts and the pinned catalog files (`reconciler.audit.spark_joins`), and their results
land as the same `JoinResults` files the local engine writes.

**Not yet done here**: acting on the results (cataloging what is missing, superseding,
the orphan file, ``missing-blob``, ``catalog-mismatch`` and ``phantom-row`` problems) and
completing the audit. That step belongs to `run_full_audit`'s act-on-`JoinResults`
phase, being written for the local engine; once it exists, `spark_audit` hands it these
files. Until then the audit record stays ``running`` (a later ``lm-reconciler audit``
resumes it: its listing's finished ranges are not listed again) and
`SparkAuditOutcome.summary` says so.

The blocking Spark calls run in threads, so the lease keeps being renewed meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from index import catalog
from protocol import keys
from protocol.records import AuditRecord
from reconciler.audit.duckdb_joins import JoinLimits, JoinResults, PinnedFileMissing
from reconciler.audit.listing import ListingParts
from reconciler.audit.records import resume_or_start, save_audit
from reconciler.audit.retired import settle_retired
from reconciler.audit.spark_joins import SparkAuditJoins
from reconciler.audit.spark_listing import list_on_spark
from reconciler.context import ReconcilerContext
from reconciler.gc.raw_retention import retired_for_audit
from reconciler.problems import ProblemBook
from rollup.table.storage import StoreAccess

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "NOT_WIRED",
    "SPARK_CONF",
    "PinnedFileMissing",
    "SparkAuditOutcome",
    "audit_spark_session",
    "spark_audit",
]

SPARK_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.files.ignoreMissingFiles": "false",  # a missing catalog file is an error
    "spark.sql.adaptive.enabled": "true",
}
"""What every audit session sets, local or under ``spark-submit``."""
NOT_WIRED = (
    "the Spark engine wrote the audit's join results; acting on them (cataloging, the "
    "orphan file, problems) and completing the audit is not wired to the Spark engine "
    "yet: the audit stays running"
)


def audit_spark_session(app_name: str = "lm-reconciler-audit") -> SparkSession:
    """The session ``spark-submit`` configured (or a local one when run without it),
    plus `SPARK_CONF`."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


@dataclass
class SparkAuditOutcome:
    record: AuditRecord
    resumed: bool
    listing: ListingParts
    results: JoinResults
    unreadable: list[tuple[str, str]]
    """Pinned catalog files that are not index files (to be moved aside and reported)."""
    limits: JoinLimits
    completed: bool = False

    def summary(self) -> dict[str, Any]:
        return {
            "audit_id": self.record.audit_id,
            "started_at_unix_ns": self.record.started_at_unix_ns,
            "engine": "spark",
            "resumed": self.resumed,
            "status": "completed" if self.completed else "running",
            "ranges": self.listing.ranges_total,
            "ranges_resumed": self.listing.ranges_resumed,
            "keys_listed": dict(self.listing.keys_listed),
            "list_requests": self.listing.list_requests,
            "results": {
                "records": self.results.records,
                "blobs": self.results.blobs,
                "referencing": self.results.referencing,
            },
            "reasons": dict(self.results.reasons),
            "limits": dataclasses.asdict(self.limits),
            "unreadable_catalog_files": [name for name, _why in self.unreadable],
            "message": None if self.completed else NOT_WIRED,
        }


async def spark_audit(
    ctx: ReconcilerContext, spark: SparkSession, *, out_dir: Path
) -> SparkAuditOutcome:
    """Start (or resume) a listing audit and run its listing and joins on ``spark``; the
    results land in ``out_dir`` (see module). Raises `PinnedFileMissing`, `LeaseLost`
    and store errors."""
    record, resumed = await resume_or_start(ctx, None)
    start = record.started_at_unix_ns
    audit_dir = keys.audit_listing_prefix(start, record.audit_id)
    access = StoreAccess.of(ctx.settings.store)
    record = await _renew_pin(ctx, record)
    # Every catalog file there is now (listed after the start): the audit's pin keeps
    # compaction from deleting any of them (PROTOCOL §3.7).
    names = [info.key async for info in catalog.list_all_files(ctx.store)]
    listing = await list_on_spark(
        spark,
        ctx.store,
        access,
        audit_dir,
        concurrency=ctx.settings.reconciler.audit_list_concurrency,
    )
    requests = dict(record.requests)
    requests["LIST"] = requests.get("LIST", 0) + listing.list_requests
    record = await _renew_pin(
        ctx,
        record,
        engine="spark",
        keys_listed={kind: int(n) for kind, n in listing.keys_listed.items()},
        requests=requests,
    )
    margin_ns = int(ctx.settings.settle_margin_s() * keys.NS_PER_S)
    limits = JoinLimits(
        born_before_ns=start + margin_ns,
        phantom_before_ns=start - margin_ns,
        orphan_before_ns=ctx.clock.now_ns() - int(ctx.settings.gc.retry_horizon_s * 1e9),
    )
    joins = await asyncio.to_thread(
        SparkAuditJoins,
        spark,
        access,
        listing.parts,
        names,
        results_prefix=f"{keys.audit_folder(start, record.audit_id)}spark-results/",
        out_dir=str(out_dir),
    )
    try:
        problems = ProblemBook(ctx)
        await problems.load()
        await settle_retired(
            joins,
            joins.readable,
            [name for name, _why in joins.unreadable],
            await retired_for_audit(ctx.store),
            problems,
        )
        results = await asyncio.to_thread(joins.run, limits)
    finally:
        await asyncio.to_thread(joins.close)
    ctx.log.warning("audit_spark_not_completed", audit_id=record.audit_id, reason=NOT_WIRED)
    return SparkAuditOutcome(record, resumed, listing, results, list(joins.unreadable), limits)


async def _renew_pin(ctx: ReconcilerContext, record: AuditRecord, **update: Any) -> AuditRecord:
    """The record with its pin renewed for another ``audit_pin_s`` and ``update``d (saved)."""
    pin_ns = int(ctx.settings.reconciler.audit_pin_s * 1e9)
    renewed = record.model_copy(
        update={
            "pin_expires_at_unix_ns": ctx.clock.now_ns() + pin_ns,
            "owner_epoch": ctx.epoch,
            **update,
        }
    )
    await save_audit(ctx, renewed)
    return renewed
