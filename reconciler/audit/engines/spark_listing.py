"""The full audit's listing on Spark executors (``reconciler.audit_engine = "spark"``,
PROTOCOL §3.9).

The driver plans the audit's ranges and finds the parts already written
(`reconciler.audit.listing.plan_listing`: the same plan, read back or created once, and the
same resume state as `list_for_audit`); each range not finished yet is one Spark task,
which opens its own store client (`ListRanges`, from the ``[store]`` settings an executor
needs: `rollup.table.storage.StoreAccess`) and lists the range through the same per-range
code (`reconciler.audit.listing.list_one_range`), so the parts are the same files, named
the same, resumed the same way: a finished range is never listed again by the same audit,
an unfinished one continues after the last key of its last part. The cluster's task slots
are the streams (Spark runs as many ranges at once as it has cores for them).

A task that fails is retried by Spark (``spark.task.maxFailures``): listing a range again
from its last written part is what a resumed audit does anyway. A ``memory://`` store is
refused (executors cannot reach it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from reconciler.audit.listing import (
    ListingParts,
    RangeWork,
    Tally,
    finished_tally,
    list_one_range,
    plan_listing,
)
from reconciler.audit.offload import in_thread
from reconciler.audit.ranges import KINDS, ListingKind
from rollup.table.storage import StoreAccess
from store.base import ObjectStore
from store.errors import StoreConfigError
from store.open import open_store

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass(frozen=True, slots=True)
class ListRanges:
    """The executors' side: list a partition's ranges with a store client of its own and
    return what was written (one `Tally`)."""

    access: StoreAccess
    audit_dir: str

    def __call__(self, works: Iterable[RangeWork]) -> Iterator[Tally]:
        yield asyncio.run(self._list(list(works)))

    async def _list(self, works: list[RangeWork]) -> Tally:
        tally = Tally()
        store = open_store(
            self.access.url, endpoint_url=self.access.endpoint_url, region=self.access.region
        )
        try:
            for work in works:
                await list_one_range(store, self.audit_dir, work, tally)
        finally:
            await store.close()
        return tally


async def list_on_spark(
    spark: SparkSession,
    store: ObjectStore,
    access: StoreAccess,
    audit_dir: str,
    *,
    concurrency: int,
    kinds: Collection[ListingKind] = KINDS,
    previous: Mapping[str, int] | None = None,
) -> ListingParts:
    """`list_for_audit` with the ranges listed by Spark tasks (one a range); ``store`` is
    the driver's client (the plan and the resume state), ``access`` what executors open.
    ``concurrency`` and ``previous`` size the plan as `list_for_audit`'s do (ranges per
    kind); only the ranges of ``kinds``."""
    if access.url.startswith("memory://"):
        raise StoreConfigError(
            f"store url {access.url!r}: Spark executors cannot reach a memory:// store"
        )
    plan = await plan_listing(
        store, audit_dir, concurrency=concurrency, kinds=kinds, previous=previous
    )
    tally = finished_tally(plan)
    pending = plan.pending
    if pending:
        rdd = spark.sparkContext.parallelize(pending, numSlices=len(pending))
        listed = await in_thread(rdd.mapPartitions(ListRanges(access, audit_dir)).collect)
        for part in listed:
            tally.add(part)
    return tally.parts_of(plan)
