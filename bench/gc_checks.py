"""`bench.gc`'s end-state checks and the store queries they and the run's progress use."""

from __future__ import annotations

from bench.gc_report import Result
from bench.gc_seed import Seeded
from index.audits import audit_keys, read_audit
from protocol import keys
from store.base import ObjectStore
from store.errors import NotFound


async def count_under(store: ObjectStore, prefix: str) -> int:
    return sum([1 async for _info in store.list(prefix)])


async def audit_records(store: ObjectStore) -> list[str]:
    """The audit records (not their orphan files), by key."""
    found = []
    for key in await audit_keys(store):
        if await read_audit(store, key) is not None:
            found.append(key)
    return found


async def orphans_left(store: ObjectStore, seeded: Seeded) -> int:
    """Planted orphans (frame blobs and bundles) still in the store."""
    planted = {keys.raw_blob_key(sha) for sha in seeded.orphans}
    planted |= {keys.raw_bundle_key(sha) for sha in seeded.orphan_bundles}
    present = set()
    for prefix in (keys.RAW_BLOBS_PREFIX, keys.RAW_BUNDLES_PREFIX):
        present |= {info.key async for info in store.list(prefix)}
    return len(present & planted)


async def exists(store: ObjectStore, key: str) -> bool:
    try:
        await store.head(key)
    except NotFound:
        return False
    return True


async def check_end_state(store: ObjectStore, seeded: Seeded, result: Result) -> None:
    def check(what: str, ok: bool, detail: str) -> None:
        result.checks.append((what, ok, detail))

    left = await orphans_left(store, seeded)
    check("every planted orphan deleted", left == 0, f"{left} of {seeded.candidates} left")
    kept = [await exists(store, keys.raw_blob_key(sha)) for sha in seeded.kept]
    check(
        "every accepted batch's blob and every quarantined blob still there",
        all(kept),
        f"{sum(kept)} of {len(kept)} present",
    )
    marks = await count_under(store, keys.GC_MARKS_PREFIX)
    check("no GC mark left", marks == 0, f"{marks} marks")
    problems = [info.key async for info in store.list(keys.RECONCILER_PROBLEMS_PREFIX)]
    check("no problem recorded", not problems, ", ".join(problems) or "none")
    result.audits = await audit_records(store)
    check("exactly one audit (the scheduled one)", len(result.audits) == 1, f"{result.audits}")
    by_gc = sum(
        n
        for run in result.runs
        for (op, area), n in run.tally.items()
        if area == "reconciler/audits" and op.startswith("put")
    )
    check("no audit record written by a GC run", by_gc == 0, f"{by_gc} audit-record PUTs")
    result.gc_log_files = [info.key async for info in store.list(keys.GC_LOG_PREFIX)]
    deleting = sum(1 for run in result.runs if run.outcome and run.outcome.deleted)
    check(
        "one GC log file per run that deleted something",
        len(result.gc_log_files) == deleting,
        f"{len(result.gc_log_files)} files, {deleting} runs deleted",
    )
