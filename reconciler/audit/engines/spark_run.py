"""A full audit with ``reconciler.audit_engine = "spark"`` (PROTOCOL §3.9): the lease holder
(this process, the Spark driver) records the audit's start and pins the catalog
(`reconciler.audit.records.resume_or_start`, as the local engine), the executors list the
ranges (`reconciler.audit.engines.spark_listing`), the joins run in Spark SQL over the listing
parts and the pinned catalog files (`reconciler.audit.engines.spark_joins`), their results land
as the local engine's `JoinResults` files in the audit's spill directory, and the lease
holder acts on them with the local engine's code (`reconciler.audit.run.AuditRun`):
catalogs what is missing, supersedes what differs, writes the orphan file, records the
``missing-blob``, ``catalog-mismatch`` and ``phantom-row`` problems and completes the
audit. Resumable as the local engine's: a rerun resumes an audit left running (its
listing's finished ranges are not listed again; its markers repaired).

The blocking Spark calls run in threads, so the lease keeps being renewed meanwhile; a stop
or a lapsed pin cancels the session's running jobs.

Where it runs: under ``spark-submit`` (`reconciler.audit.spark_entry`: that process takes
the lease, so no daemon may be active meanwhile), from ``lm-reconciler audit --engine
spark`` (the same, with the session `audit_spark_session` finds), or in the daemon's audit
child when ``[reconciler] audit_engine = "spark"`` (`reconciler.audit.worker`: under the
daemon's lease, beside its steady pass, PROTOCOL §3.9).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from protocol import keys
from protocol.records import AuditRecord
from reconciler.audit.audit_inputs import set_aside
from reconciler.audit.engines.duckdb_joins import PinnedFileMissing
from reconciler.audit.engines.spark_joins import SparkAuditJoins
from reconciler.audit.engines.spark_listing import list_on_spark
from reconciler.audit.inventory import InventorySource
from reconciler.audit.listing import parts_from_inventory, with_inventory
from reconciler.audit.offload import in_thread
from reconciler.audit.progress import PROGRESS_INTERVAL_S, ProgressCallback
from reconciler.audit.ranges import KINDS, RAW_KINDS, previous_keys
from reconciler.audit.records import resume_or_start
from reconciler.audit.run import AuditRun, run_full_audit
from reconciler.context import ReconcilerContext
from reconciler.gc.raw_retention import retired_for_audit
from rollup.table.storage import StoreAccess
from store.errors import StoreError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

P = ParamSpec("P")
T = TypeVar("T")

__all__ = [
    "SPARK_CONF",
    "PinnedFileMissing",
    "SparkAuditRun",
    "audit_spark_session",
    "configured_audit",
    "spark_audit",
]

SPARK_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.files.ignoreMissingFiles": "false",  # a missing catalog file is an error
    "spark.sql.adaptive.enabled": "true",
}
"""What every audit session sets, local or under ``spark-submit``."""
SUBMITTED = "PYSPARK_GATEWAY_PORT"
"""Set by ``spark-submit`` for the Python driver it starts (its JVM is already up)."""


def audit_spark_session(app_name: str = "lm-reconciler-audit") -> SparkSession:
    """The session ``spark-submit`` configured, plus `SPARK_CONF`. Outside spark-submit
    (``lm-reconciler audit --engine spark``, the daemon's audit child), what standard
    PySpark configuration gives: ``spark-defaults.conf`` under ``SPARK_CONF_DIR`` or
    ``PYSPARK_SUBMIT_ARGS`` (``--master``, ``--py-files`` with the audit zip for a cluster),
    else a local session; its Python workers run this interpreter unless
    ``PYSPARK_PYTHON`` says otherwise (they import this project's packages)."""
    from pyspark.sql import SparkSession

    if SUBMITTED not in os.environ:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    for key, value in SPARK_CONF.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
ROWS_PER_SHUFFLE_PARTITION = 250_000
"""The joins' rows are keys with a few columns (a couple of hundred bytes each): 250,000
make a shuffle partition of about the 64 MiB Spark's adaptive execution aims for."""


def shuffle_partitions(rows: int, parallelism: int) -> int:
    """The joins' shuffle partitions for ``rows`` listed keys: one per
    `ROWS_PER_SHUFFLE_PARTITION`, at least one per core (``parallelism``). Spark's fixed
    200 is 100 tasks a core per join on a small store (about twice the audit's time), and
    5 million rows a partition at a billion manifests."""
    return max(1, parallelism, -(-rows // ROWS_PER_SHUFFLE_PARTITION))


def size_shuffle(spark: SparkSession, rows: int) -> int | None:
    """Set the session's shuffle partitions from the listing (`shuffle_partitions`), unless
    the operator's Spark configuration sets them (``spark-submit --conf``,
    ``spark-defaults.conf``, ``PYSPARK_SUBMIT_ARGS``): then theirs stand and this returns
    None."""
    if spark.sparkContext.getConf().contains(SHUFFLE_PARTITIONS):
        return None
    partitions = shuffle_partitions(rows, spark.sparkContext.defaultParallelism)
    spark.conf.set(SHUFFLE_PARTITIONS, str(partitions))
    return partitions


async def configured_audit(
    ctx: ReconcilerContext,
    *,
    progress: ProgressCallback | None = None,
    inventory: InventorySource | None = None,
) -> AuditRecord:
    """A full audit (run or resumed) on the engine ``[reconciler] audit_engine`` names: the
    local one (`run_full_audit`), or Spark with the session `audit_spark_session` finds
    (stopped after). What the daemon's audits run, in its child or in line."""
    if ctx.settings.reconciler.audit_engine != "spark":
        return await run_full_audit(ctx, progress=progress, inventory=inventory)
    spark = await in_thread(audit_spark_session)
    try:
        return await spark_audit(ctx, spark, progress=progress, inventory=inventory)
    finally:
        await in_thread(spark.stop)


async def spark_audit(
    ctx: ReconcilerContext,
    spark: SparkSession,
    *,
    progress: ProgressCallback | None = None,
    inventory: InventorySource | None = None,
) -> AuditRecord:
    """Run (or resume) a listing audit with its listing and joins on ``spark`` and return
    its final record, as `reconciler.audit.run.run_full_audit` does (``completed`` only
    when it finished with every catalog write done; ``running`` otherwise: call again).
    Raises `LeaseLost` and store errors met while creating the record."""
    record, resumed = await resume_or_start(ctx, inventory)
    run = SparkAuditRun(ctx, record, resumed, spark, progress, inventory)
    return await run.perform()


class SparkAuditRun(AuditRun):
    """`AuditRun` with the listing and the joins on Spark (see module)."""

    ENGINE = "spark"

    def __init__(
        self,
        ctx: ReconcilerContext,
        record: AuditRecord,
        resumed: bool,
        spark: SparkSession,
        progress: ProgressCallback | None = None,
        inventory: InventorySource | None = None,
    ) -> None:
        super().__init__(ctx, record, resumed, progress, PROGRESS_INTERVAL_S, inventory)
        self._spark = spark

    async def _work(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Every Spark call blocks: always in a thread."""
        return await in_thread(fn, *args, **kwargs)

    def _cancel_jobs(self) -> None:
        self._spark.sparkContext.cancelAllJobs()

    async def execute(self, spill: str) -> None:
        """The catalog's listing (the files the pin covers), the listing on the executors,
        the joins in Spark, then `AuditRun`'s acts; sets ``failed``/``stopped``."""
        ctx = self._ctx
        record = self._record
        start = record.started_at_unix_ns
        access = StoreAccess.of(ctx.settings.store)
        self.spill_dir = spill
        try:
            names = await self.list_catalog()
            audit_dir = keys.audit_listing_prefix(start, record.audit_id)
            listing = await self.run_phase(
                list_on_spark(
                    self._spark,
                    ctx.store,
                    access,
                    audit_dir,
                    concurrency=ctx.settings.reconciler.audit_list_concurrency,
                    kinds=KINDS if self._inventory is None else RAW_KINDS,
                    previous=previous_keys(self._cursors),
                ),
                self._cancel_jobs,
            )
            if listing is None or not self._going():
                return
            if self._inventory is not None:  # it nominates the records
                report = await parts_from_inventory(ctx.store, audit_dir, self._inventory)
                listing = with_inventory(listing, report)
            self._keys_listed = {kind: int(n) for kind, n in listing.keys_listed.items()}
            self.count_requests("LIST", listing.list_requests)
            # The executors' reads: each pinned catalog file and each listing part once.
            parts = sum(len(p) for p in listing.parts.values())
            self.count_requests("GET", len(names) + parts)
            retired = await retired_for_audit(ctx.store)
        except StoreError as exc:
            self._store_failure("audit_listing", exc)
            return
        rows = sum(self._keys_listed.values())
        partitions = await in_thread(size_shuffle, self._spark, rows)
        ctx.log.info("audit_spark_shuffle", rows_listed=rows, partitions=partitions or "configured")
        memory_mb = max(64, ctx.settings.reconciler.audit_memory_limit_mb // 2)
        try:
            joins = await self.run_phase(
                in_thread(
                    SparkAuditJoins,
                    self._spark,
                    access,
                    listing.parts,
                    names,
                    results_prefix=f"{keys.audit_folder(start, record.audit_id)}spark-results/",
                    out_dir=spill,
                    memory_limit_mb=memory_mb,
                ),
                self._cancel_jobs,
            )
        except PinnedFileMissing as exc:
            ctx.log.error("audit_pinned_file_missing", error=str(exc))
            ctx.metrics.store_failures.labels("audit_catalog").inc()
            self.failed = True
            return
        if joins is None:
            return
        try:
            if not self._going():
                return
            await set_aside(ctx, self.problems, joins.unreadable)
            self._joins = joins
            async with self.verifier.running():
                await self._join_and_act(joins, joins.readable, joins.unreadable, retired, spill)
        except StoreError as exc:
            self._store_failure("audit_catalog", exc)
        finally:
            self._joins = None
            await in_thread(joins.close)
