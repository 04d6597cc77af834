"""Repair of one accepted manifest or one quarantine record: idempotent, fenced, counted.

For a record, `Repairer` creates every derived entry of `protocol.derived` with
If-None-Match (412 is success: the entry was there), then checks the raw blob the record
references: ``HEAD`` (exists; for manifests also the size) in steady state; in audits
``LISTED``: the audit's up-front listing (`reconciler.listed.ListedKeys`) showed the blob
with the manifest's size, else a HEAD as in steady state. An audit also skips the creates
of entries its listing showed. SHA-256 verification of blobs is not per record: see
`reconciler.verify`.

Order matters in two places:
- ``accepted-by-time`` is created last, and the hour's rollup-dirty marker right after it:
  a rollup that consumes the marker then lists the hour and finds the entry. "The hour
  gained an entry" means "we created its accepted-by-time entry" (markers are consumed
  by the rollup, so their absence says nothing).
- The fence is checked once per record, before its writes.

``raw-blobs-by-time`` is backfilled only for records younger than ``gc.retry_horizon_s``.
Older hours belong to the GC: it considers their blobs and removes the entries of blobs it
finds referenced (a referenced blob never becomes an orphan), so restoring those from
manifests would only make every audit re-create what every GC run removes again. Orphan
blobs, the ones the index is for, have no record to rebuild it from; the GC finds them by
listing ``raw-blobs/v1/``.

What cannot be repaired becomes a problem record (`reconciler.problems`). A store error
left after retries marks the outcome ``failed``: the caller must not count the record as
done (audits keep their cursor before it; steady passes keep their checkpoint).
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

from protocol import derived, keys
from protocol.derived import DerivedEntry
from protocol.records import AcceptedManifest, IdentityConflict, RecordError, RollupDirty
from store.errors import StoreError

from . import store_calls
from .context import ReconcilerContext
from .listed import ListedKeys
from .problems import ProblemBook


class BlobCheck(enum.Enum):
    NONE = "none"
    HEAD = "head"
    LISTED = "listed"
    """Listed with the expected size (manifests; the `Repairer`'s ``listed``), else HEAD."""


@dataclass
class RepairOutcome:
    """What repairing one or more records did."""

    created: Counter[str] = field(default_factory=Counter)
    """Objects created, by kind (derived entry kinds and ``rollup-dirty``)."""
    problems: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    """Records whose repair hit a store error after retries (not done: redo later)."""
    missing_source: int = 0
    """Keys that named a record that does not exist (dangling index entries)."""

    def add(self, other: RepairOutcome) -> None:
        self.created.update(other.created)
        self.problems.update(other.problems)
        self.failed += other.failed
        self.missing_source += other.missing_source


class Repairer:
    def __init__(
        self,
        ctx: ReconcilerContext,
        problems: ProblemBook,
        *,
        listed: ListedKeys | None = None,
    ) -> None:
        self._ctx = ctx
        self._problems = problems
        self._listed = listed

    # --- accepted manifests -------------------------------------------------------------

    async def manifest_at(
        self, key: str, *, blob_check: BlobCheck, listed_in_hour: keys.UtcHour | None = None
    ) -> RepairOutcome:
        """Read the manifest at ``key`` and repair it. ``listed_in_hour``: the hour whose
        accepted-by-time listing named it (that entry exists, if it is the right hour)."""
        outcome = RepairOutcome()
        try:
            body = await store_calls.read(self._ctx, key)
        except StoreError as exc:
            return self._failed(outcome, "read_manifest", key, exc)
        if body is None:
            outcome.missing_source += 1
            return outcome
        try:
            manifest = AcceptedManifest.from_json(body)
            # Either form of PROTOCOL §3's segment rule is the record's own key.
            own = (manifest.manifest_key, keys.legacy_accepted_manifest_key(manifest.identity))
            if key not in own:
                raise RecordError(f"content names {manifest.manifest_key!r}, not its own key")
        except RecordError as exc:
            await self._problem(outcome, "unparseable-manifest", key, str(exc))
            return outcome
        await self._problems.resolve("unparseable-manifest", key)
        present = (
            frozenset({"accepted-by-time"})
            if listed_in_hour is not None and manifest.accepted_hour == listed_in_hour
            else frozenset()
        )
        outcome.add(await self.manifest(manifest, blob_check=blob_check, present=present, key=key))
        return outcome

    async def manifest(
        self,
        manifest: AcceptedManifest,
        *,
        blob_check: BlobCheck,
        present: frozenset[str] = frozenset(),
        key: str | None = None,
    ) -> RepairOutcome:
        """Repair ``manifest``, stored at ``key`` (default: its key under the segment rule)."""
        outcome = RepairOutcome()
        key = key or manifest.manifest_key
        entries = [
            e
            for e in derived.manifest_backfill(manifest, key)
            if e.kind not in present
            and self._wanted(e, manifest.accepted_at_unix_ns)
            and not self._was_listed(e)
        ]
        await self._create_entries(outcome, entries)
        await self._check_blob(
            outcome,
            manifest.frame_sha256,
            referenced_by=key,
            expected_size=manifest.frame_bytes,
            check=blob_check,
        )
        return outcome

    # --- quarantine records -------------------------------------------------------------

    async def quarantine_at(self, key: str, *, blob_check: BlobCheck) -> RepairOutcome:
        outcome = RepairOutcome()
        try:
            body = await store_calls.read(self._ctx, key)
        except StoreError as exc:
            return self._failed(outcome, "read_quarantine", key, exc)
        if body is None:
            outcome.missing_source += 1
            return outcome
        try:
            conflict = IdentityConflict.from_json(body)
            sha = conflict.submitted_frame_sha256
            own = (conflict.quarantine_key, keys.legacy_quarantine_key(conflict.identity, sha))
            if key not in own:
                raise RecordError(f"content names {conflict.quarantine_key!r}, not its own key")
        except RecordError as exc:
            await self._problem(outcome, "unparseable-quarantine", key, str(exc))
            return outcome
        await self._problems.resolve("unparseable-quarantine", key)
        entries = [
            e
            for e in derived.quarantine_backfill(conflict, key)
            if self._wanted(e, conflict.observed_at_unix_ns) and not self._was_listed(e)
        ]
        await self._create_entries(outcome, entries)
        await self._check_blob(
            outcome,
            conflict.submitted_frame_sha256,
            referenced_by=key,
            expected_size=None,
            check=blob_check,
        )
        return outcome

    # --- writes -------------------------------------------------------------------------

    def _was_listed(self, entry: DerivedEntry) -> bool:
        """The audit's listing returned this entry's key: it exists (entries the audit
        creates are never deleted; see `reconciler.listed`), no create needed."""
        return self._listed is not None and self._listed.has_entry(entry.key)

    def _wanted(self, entry: DerivedEntry, record_time_ns: int) -> bool:
        if entry.kind != "raw-blobs-by-time":
            return True
        horizon_ns = int(self._ctx.settings.gc.retry_horizon_s * 1e9)
        return record_time_ns >= self._ctx.clock.now_ns() - horizon_ns

    async def _create_entries(self, outcome: RepairOutcome, entries: list[DerivedEntry]) -> None:
        ctx = self._ctx
        # accepted-by-time last, so its dirty marker follows the entry it announces.
        entries = sorted(entries, key=lambda e: e.kind == "accepted-by-time")
        await ctx.check_fence()
        failed = False
        for entry in entries:
            try:
                created = await store_calls.create_if_absent(ctx, entry.key, entry.body)
            except StoreError as exc:
                failed = True
                ctx.metrics.store_failures.labels("repair").inc()
                ctx.log.warning("derived_entry_repair_failed", key=entry.key, error=str(exc))
                continue
            if created is store_calls.Created.CREATED:
                self._count(outcome, entry.kind)
                ctx.log.debug("derived_entry_repaired", kind=entry.kind, key=entry.key)
            if created.possibly_ours and entry.kind == "accepted-by-time":
                assert entry.hour is not None
                failed |= not await self._mark_dirty(outcome, entry.hour)
        if failed:
            outcome.failed += 1

    async def _mark_dirty(self, outcome: RepairOutcome, hour: keys.UtcHour) -> bool:
        ctx = self._ctx
        marker = RollupDirty(hour=hour.iso, marked_at_unix_ns=ctx.clock.now_ns())
        try:
            created = await store_calls.create_if_absent(
                ctx, keys.rollup_dirty_key(hour), marker.to_json()
            )
        except StoreError as exc:
            ctx.metrics.store_failures.labels("rollup_dirty").inc()
            ctx.log.warning("rollup_dirty_failed", hour=hour.iso, error=str(exc))
            return False
        if created is store_calls.Created.CREATED:
            self._count(outcome, "rollup-dirty")
        return True

    def _count(self, outcome: RepairOutcome, kind: str) -> None:
        outcome.created[kind] += 1
        self._ctx.metrics.repairs.labels(kind).inc()

    # --- blobs --------------------------------------------------------------------------

    async def _check_blob(
        self,
        outcome: RepairOutcome,
        sha: str,
        *,
        referenced_by: str,
        expected_size: int | None,
        check: BlobCheck,
    ) -> None:
        if check is BlobCheck.NONE:
            return
        blob_key = keys.raw_blob_key(sha)
        if (
            check is BlobCheck.LISTED
            and self._listed is not None
            and expected_size is not None
            and self._listed.has_blob(blob_key, expected_size)
        ):
            await self._problems.resolve("missing-blob", blob_key)
            return
        try:
            problem = await self._head_blob(blob_key, expected_size)
        except StoreError as exc:
            # Not a failed repair: nothing was left unwritten. The next check looks again.
            self._ctx.metrics.store_failures.labels("blob_check").inc()
            self._ctx.log.warning("blob_check_failed", key=blob_key, error=str(exc))
            return
        if problem is None:
            await self._problems.resolve("missing-blob", blob_key)
            return
        kind, detail = problem
        await self._problem(outcome, kind, blob_key, f"{detail}; referenced by {referenced_by}")

    async def _head_blob(self, blob_key: str, expected_size: int | None) -> tuple[str, str] | None:
        info = await store_calls.head(self._ctx, blob_key)
        if info is None:
            return "missing-blob", "raw blob does not exist"
        if expected_size is not None and info.size != expected_size:
            return "corrupt-blob", f"raw blob has {info.size} bytes, manifest says {expected_size}"
        return None

    # --- outcomes -----------------------------------------------------------------------

    async def _problem(self, outcome: RepairOutcome, kind: str, subject: str, detail: str) -> None:
        outcome.problems[kind] += 1
        await self._problems.record(kind, subject, detail)

    def _failed(
        self, outcome: RepairOutcome, stage: str, key: str, exc: StoreError
    ) -> RepairOutcome:
        outcome.failed += 1
        self._ctx.metrics.store_failures.labels(stage).inc()
        self._ctx.log.warning("reconciler_read_failed", stage=stage, key=key, error=str(exc))
        return outcome
