"""The invariant auditor: what must hold after a chaos scenario, once the reconciler and
the rollup have converged. Reads the store directly (never through the fault proxy).

Checks (`CheckResult`, each ``passed``, ``failed`` with its violations, or ``skipped``
with the reason):

- ``acks_have_manifests``: every 200 an agent got has its accepted manifest, naming the
  hash the agent sent and the 200 named, and a raw object holding that frame;
- ``one_hash_per_identity``: no identity was acknowledged with two hashes; every 409 named
  the hash the store holds; the agents saw nothing their contract calls unexpected;
- ``catalog_complete`` (the index, PROTOCOL §3.7; run after a completed full audit): the
  catalog holds every accepted manifest and quarantine record with its hash, no row
  names a record the store lacks, every catalog file reads, and every cataloged batch
  is in the committed rollup ledger or in a file a work marker names
  (`chaos.index_checks`);
- ``no_referenced_blob_deleted``: every manifest's and quarantine record's raw object
  exists and holds its frame, and no GC log entry deleted a raw object that a record
  existing at the time (by the store's own LastModified) named; with the GC's horizon and grace given,
  every logged deletion also kept rules 3 and 5 of PROTOCOL §3.5 as its entry records
  them (`gc_log_violations`);
- ``nothing_acked_during_outage``: no 200 for a request sent and answered inside a window
  when the store was unreachable;
- ``accepted_at_in_store_time`` (`chaos.clock_checks`, added by the runner): every
  manifest's ``accepted_at`` agrees with its LastModified within the clock skew allowed
  and the GC's mark grace;
- the rollup checks of `chaos.rollup_check` (setsums per hour against the manifests and
  against the catalog, totals against the ground truth, ``lm-rollup verify``), skipped
  when the rollup is not available.

Records are joined to raw objects by raw key (PROTOCOL §3.10): a manifest names a frame
blob (read whole, hashed) or a bundle and its frame's range (the frame read through
`index.raw_reads`, which checks its CRC, hash and identity; a bundle is fetched once for
all the records naming it, its frames cut out of it, a frame that fails falls back to
the bundle's index: `read_frame`). A quarantine record names frame blobs only.

Besides the checks, `gc_coverage` counts the planted orphans (`AckBook.planted`) that no
record references and are older than the GC's retry horizon, and how many of them the
GC has deleted: a figure, not a check (a short round ends before the GC's mark, grace
and audit have run their course).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from chaos.index_checks import (
    CatalogView,
    RecordFacts,
    catalog_problems,
    named,
    read_catalog,
    read_frames,
    submitted_ref,
)
from chaos.load import AckBook
from index.raw_reads import RawRef
from protocol import keys, records
from reconciler.gc.log import GcLogError, decode_gc_log
from store.base import ObjectInfo, ObjectStore

T = TypeVar("T")
Status = Literal["passed", "failed", "skipped"]
MAX_LISTED = 50  # violations kept per check (the count is always exact)
GC_LOG_SLACK_NS = 5 * keys.NS_PER_S


@dataclass
class CheckResult:
    name: str
    status: Status = "passed"
    violations: list[str] = field(default_factory=list)
    violation_count: int = 0
    detail: str = ""

    def fail(self, text: str) -> None:
        self.status = "failed"
        self.violation_count += 1
        if len(self.violations) < MAX_LISTED:
            self.violations.append(text)

    @classmethod
    def skipped(cls, name: str, reason: str) -> CheckResult:
        return cls(name, "skipped", detail=reason)

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "violations": self.violation_count,
            "examples": self.violations,
            "detail": self.detail,
        }


@dataclass
class StoreView:
    """What the store holds, read once for every check."""

    objects: dict[str, ObjectInfo]
    manifests: dict[keys.BatchIdentity, tuple[records.AcceptedManifest, ObjectInfo]]
    quarantines: dict[str, records.IdentityConflict]
    frames: dict[RawRef, str | None]
    """Each record's frame (`RawRef.of_manifest`): None when its raw object holds it, else
    what is wrong ("missing", "hashes to ...", "bad-range: ...")."""
    gc_log: list[records.GcLogEntry]
    unreadable: list[str]
    catalog: CatalogView = field(default_factory=CatalogView)
    rolled_up: set[str] = field(default_factory=set)
    """manifest_ids the latest committed rollup ledger includes."""

    def under(self, prefix: str) -> Iterable[str]:
        return (k for k in self.objects if k.startswith(prefix))


async def _bounded(
    items: Iterable[T], work: Callable[[T], Awaitable[None]], limit: int = 16
) -> None:
    gate = asyncio.Semaphore(limit)

    async def one(item: T) -> None:
        async with gate:
            await work(item)

    await asyncio.gather(*(one(item) for item in items))


async def read_store(store: ObjectStore) -> StoreView:
    objects = {info.key: info async for info in store.list("")}
    view = StoreView(objects, {}, {}, {}, [], [])

    async def manifest(key: str) -> None:
        try:
            parsed = records.AcceptedManifest.from_json(
                (await store.get(key))[0], reads_bundles=True
            )
        except records.RecordError as exc:
            view.unreadable.append(f"{key}: {exc}")
            return
        view.manifests[parsed.identity] = (parsed, objects[key])

    async def quarantine(key: str) -> None:
        try:
            view.quarantines[key] = records.IdentityConflict.from_json((await store.get(key))[0])
        except records.RecordError as exc:
            view.unreadable.append(f"{key}: {exc}")

    async def gc_file(key: str) -> None:
        try:
            view.gc_log += decode_gc_log((await store.get(key))[0], key=key)
        except GcLogError as exc:
            view.unreadable.append(str(exc))

    await _bounded(list(view.under(keys.ACCEPTED_PREFIX)), manifest)
    await _bounded(list(view.under(keys.QUARANTINE_PREFIX)), quarantine)
    await _bounded(list(view.under(keys.GC_LOG_PREFIX)), gc_file)
    by_object: dict[str, set[RawRef]] = defaultdict(set)
    for accepted, _ in view.manifests.values():
        ref = RawRef.of_manifest(accepted)
        by_object[ref.raw_key].add(ref)
    for conflict in view.quarantines.values():
        ref = submitted_ref(conflict)
        by_object[ref.raw_key].add(ref)

    await _bounded(sorted(by_object), lambda key: read_frames(store, by_object[key], view.frames))
    view.catalog = await read_catalog(store)
    view.rolled_up = await _rolled_up(store)
    return view


async def _rolled_up(store: ObjectStore) -> set[str]:
    from rollup.table.commit import load_latest  # the rollup package is optional here
    from rollup.table.ledger import read_ledger

    latest = await load_latest(store)
    if latest is None:
        return set()
    table = await read_ledger(store, latest.snapshot)
    return set(table.column("manifest_id").to_pylist())


def check_acks(view: StoreView, book: AckBook) -> CheckResult:
    result = CheckResult("acks_have_manifests")
    for ack in book.acks:
        held = view.manifests.get(ack.identity)
        if held is None:
            result.fail(f"200 for {ack.identity} but no accepted manifest")
            continue
        manifest, _ = held
        if manifest.frame_sha256 != ack.frame_sha256:
            result.fail(
                f"200 for {ack.identity} sent {ack.frame_sha256[:16]}, manifest holds {manifest.frame_sha256[:16]}"
            )
        if ack.answered_sha256 is not None and ack.answered_sha256 != manifest.frame_sha256:
            result.fail(
                f"200 for {ack.identity} named {ack.answered_sha256[:16]}, manifest holds {manifest.frame_sha256[:16]}"
            )
        if ack.manifest_key is not None and ack.manifest_key != manifest.manifest_key:
            result.fail(f"200 for {ack.identity} named manifest {ack.manifest_key}")
        ref = RawRef.of_manifest(manifest)
        state = view.frames.get(ref, "not read")
        if state is not None:
            result.fail(f"acknowledged {ack.identity}: raw object {named(ref)} {state}")
    result.detail = f"{len(book.acks)} acknowledgements checked"
    return result


def check_identities(view: StoreView, book: AckBook, unexpected: list[str]) -> CheckResult:
    result = CheckResult("one_hash_per_identity")
    hashes: dict[keys.BatchIdentity, set[str]] = defaultdict(set)
    for ack in book.acks:
        hashes[ack.identity].add(ack.frame_sha256)
    for identity, shas in hashes.items():
        if len(shas) > 1:
            result.fail(
                f"{identity} acknowledged with {len(shas)} hashes: {sorted(s[:16] for s in shas)}"
            )
    for identity, submitted, accepted in book.conflicts:
        held = view.manifests.get(identity)
        if held is None:
            result.fail(f"409 for {identity} but no accepted manifest")
        elif accepted is not None and held[0].frame_sha256 != accepted:
            result.fail(
                f"409 for {identity} named {accepted[:16]}, store holds {held[0].frame_sha256[:16]}"
            )
        elif held[0].frame_sha256 == submitted:
            result.fail(f"409 for {identity} although the store holds the submitted frame")
    for problem in unexpected:
        result.fail(f"agent: {problem}")
    for problem in view.unreadable:
        result.fail(f"unreadable record {problem}")
    result.detail = f"{len(hashes)} identities, {len(book.conflicts)} conflicts answered"
    return result


def check_catalog(view: StoreView) -> CheckResult:
    result = CheckResult("catalog_complete")
    facts = {  # by the key read (a manifest of a long agent_id may sit at its older form)
        info.key: RecordFacts(
            "accepted",
            manifest.frame_sha256,
            manifest.identity.manifest_id,
            RawRef.of_manifest(manifest),
        )
        for manifest, info in view.manifests.values()
    }
    for key, conflict in view.quarantines.items():
        facts[key] = RecordFacts(
            "quarantine", conflict.submitted_frame_sha256, raw=submitted_ref(conflict)
        )
    for problem in catalog_problems(view.catalog, facts, rolled_up=view.rolled_up):
        result.fail(problem)
    catalog = view.catalog
    result.detail = (
        f"{len(catalog.rows)} catalog rows in {catalog.files} files, {len(view.manifests)} "
        f"manifests, {len(view.quarantines)} quarantine records, {len(view.rolled_up)} rolled up"
    )
    return result


def check_blobs(view: StoreView) -> CheckResult:
    result = CheckResult("no_referenced_blob_deleted")
    naming: list[tuple[RawRef, str, int]] = [
        (RawRef.of_manifest(manifest), manifest.manifest_key, info.last_modified_ns)
        for manifest, info in view.manifests.values()
    ]
    naming += [
        (submitted_ref(conflict), key, view.objects[key].last_modified_ns)
        for key, conflict in view.quarantines.items()
    ]
    referencing: dict[str, list[tuple[str, int]]] = defaultdict(list)  # by raw key
    for ref, record_key, created_ns in sorted(naming, key=lambda n: n[1]):
        referencing[ref.raw_key].append((record_key, created_ns))
        state = view.frames.get(ref, "not read")
        if state is not None:
            result.fail(f"raw object {named(ref)} named by {record_key}: {state}")
    for entry in view.gc_log:
        for record_key, created_ns in referencing.get(entry.raw_blob_key, []):
            # LastModified has one-second resolution and the GC stamps its log entry
            # after the delete (a retry later, under faults): only a reference created
            # well before the stamp is certainly older than the deletion.
            if created_ns + GC_LOG_SLACK_NS <= entry.deleted_at_unix_ns:
                result.fail(
                    f"GC deleted raw object {entry.raw_blob_key} at {entry.deleted_at_unix_ns} "
                    f"while {record_key} (created {created_ns}) named it"
                )
    bundles = sum(1 for key in referencing if key.startswith(keys.RAW_BUNDLES_PREFIX))
    result.detail = (
        f"{len(referencing)} referenced raw objects ({bundles} bundles), "
        f"{len(view.gc_log)} GC deletions"
    )
    return result


def gc_log_violations(
    entries: Iterable[records.GcLogEntry], *, horizon_s: float, grace_s: float
) -> list[str]:
    """Deletions whose log entry breaks PROTOCOL §3.5 rule 3 (deleted before its mark was
    ``mark_grace`` old) or rule 5 (its proof rested on an audit that did not start after
    the blob's LastModified + ``retry_horizon``). Entries of deletions a stale-deletion
    pass found done (no audit recorded: 0) are judged by rule 3 only, when their mark is
    known."""
    problems = []
    for entry in entries:
        sha = entry.frame_sha256[:16]
        if entry.marked_at_unix_ns and (
            entry.deleted_at_unix_ns < entry.marked_at_unix_ns + int(grace_s * keys.NS_PER_S)
        ):
            problems.append(f"GC deleted {sha} before its mark was {grace_s:g}s old (rule 3)")
        if entry.audit_started_at_unix_ns and entry.audit_started_at_unix_ns <= (
            entry.blob_last_modified_ns + int(horizon_s * keys.NS_PER_S)
        ):
            problems.append(
                f"GC deleted {sha} on an audit that did not start after its LastModified "
                f"+ {horizon_s:g}s (rule 5)"
            )
    return problems


def check_outages(book: AckBook, windows: list[tuple[float, float]]) -> CheckResult:
    result = CheckResult("nothing_acked_during_outage")
    if not windows:
        return CheckResult.skipped(result.name, "no outage in this scenario")
    for start, end in windows:
        for ack in book.acks:
            if ack.sent_at >= start and ack.answered_at <= end:
                result.fail(
                    f"{ack.identity} acknowledged {ack.answered_at - start:.2f}s into an outage "
                    f"of {end - start:.1f}s (sent {ack.sent_at - start:.2f}s in)"
                )
    result.detail = f"{len(windows)} outage window(s), {sum(e - s for s, e in windows):.1f}s"
    return result


async def audit(
    store: ObjectStore,
    book: AckBook,
    outage_windows: list[tuple[float, float]],
    *,
    gc_timing: tuple[float, float] | None = None,
) -> tuple[StoreView, list[CheckResult]]:
    """Every store-side check (over everything so far; the agents' unexpected answers
    since the last audit); the rollup checks are added by the caller. ``gc_timing``:
    the GC's ``(retry_horizon_s, mark_grace_s)``, to check each logged deletion by them."""
    view = await read_store(store)
    blobs = check_blobs(view)
    if gc_timing is not None:
        horizon_s, grace_s = gc_timing
        for problem in gc_log_violations(view.gc_log, horizon_s=horizon_s, grace_s=grace_s):
            blobs.fail(problem)
    return view, [
        check_acks(view, book),
        check_identities(view, book, book.take_unexpected()),
        check_catalog(view),
        blobs,
        check_outages(book, outage_windows),
    ]


def gc_coverage(view: StoreView, book: AckBook, *, now_ns: int, horizon_s: float) -> dict[str, int]:
    """Planted orphans that nothing references and are older than the horizon, and how
    many of them are gone (the GC deleted them)."""
    referenced = {m.raw_blob_key for m, _ in view.manifests.values()}  # by raw key
    referenced |= {q.submitted_raw_blob_key for q in view.quarantines.values()}
    cutoff_ns = now_ns - int(horizon_s * keys.NS_PER_S)
    orphans = [  # planted orphans are frame blobs
        keys.raw_blob_key(sha)
        for sha, at in book.planted.items()
        if keys.raw_blob_key(sha) not in referenced and at < cutoff_ns
    ]
    deleted = sum(1 for key in orphans if key not in view.objects)
    return {"planted_orphans_past_horizon": len(orphans), "planted_orphans_deleted": deleted}


def store_counts(view: StoreView) -> dict[str, int]:
    return {
        "accepted_manifests": len(view.manifests),
        "quarantine_records": len(view.quarantines),
        "raw_blobs": sum(1 for _ in view.under(keys.RAW_BLOBS_PREFIX)),
        "raw_bundles": sum(1 for _ in view.under(keys.RAW_BUNDLES_PREFIX)),
        "bundled_manifests": sum(1 for m, _ in view.manifests.values() if m.raw_offset is not None),
        "gc_deletions_logged": len(view.gc_log),
        "gc_vetoes": sum(1 for _ in view.under(keys.GC_VETOES_PREFIX)),
        "gc_marks_left": sum(1 for _ in view.under(keys.GC_MARKS_PREFIX)),
        "catalog_files": view.catalog.files,
        "catalog_rows": len(view.catalog.rows),
        "work_markers": sum(1 for _ in view.under(keys.ROLLUP_WORK_PREFIX)),
        "log_segments": sum(1 for _ in view.under(keys.INDEX_LOG_PREFIX)),
        "objects": len(view.objects),
    }
