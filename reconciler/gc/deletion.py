"""Step 3 of a GC run: prove and delete (PROTOCOL §3.5 rules 1-7).

For each ``marked`` mark older than ``mark_grace`` (rule 3), against the *rule-5 audit*:
the latest completed listing audit, which the GC never starts (the daemon runs audits on
schedule; a candidate waits for the next one) and which must have recorded its
catalog-created position (audits written before that cannot serve):

- **rule 2, first half, and rule 1**: the audit's orphan file names B. If it does not
  and the audit started after the mark, its listing (after the mark) shows B referenced,
  gone or young: the mark is withdrawn. If it does not and the audit started before the
  mark, B waits for a later audit. If it names B and the audit started after the mark,
  its listing is rule 1's; otherwise a HEAD made now is (gone: withdrawn), and its
  LastModified is the one the rules use;
- **rule 4**: a vetoed mark is withdrawn (the veto stays until `reconciler.gc.vetoes`);
- **rule 5**: the audit started after B's LastModified + ``retry_horizon`` (else B
  waits for a later audit);
- **rule 2, second half**: no row of a catalog file created since the audit started
  references B (`reconciler.gc.catalog_since`; a file that cannot be read, or vanished
  without a merged file naming it: the run deletes nothing);
- **rule 7**: the targeted proof (`reconciler.gc.proof`), raw retention's variant for
  the blobs the orphan file flags.

The deletion guard then refuses the whole run when it would delete more than
``max_delete_fraction`` of the blobs the audit listed (blobs raw retention lets go of do
not count: bulk deletions are what it is for). For each blob (`Deleter.delete_one`): the
mark goes ``marked`` → ``deleting`` with If-Match (recording our lease; an unknown
outcome is read back), then the veto and the references the steady pass has seen since
are checked once more, the targeted proof runs again (when it outlasted what the
recorded lease has left for the DELETE, the renewed lease is recorded on the mark
first: `Deleter._record_a_lease_long_enough`), and the blob is deleted by one
signed request that cannot land after that lease (rule 6, `reconciler.gc.delete`). A
deleted blob goes into the run's log (`reconciler.gc.log`); its mark is removed only once
the log file exists. A request discarded unsent or refused by the store deleted nothing:
its mark is removed at once; one whose outcome is unknown leaves the mark ``deleting``
for the stale-deletion pass.

Why ``deleting``: a collector that finds a mark writes its veto, then re-reads the mark
(`collector.blob_survival`). If it still reads ``marked``, the veto was written before
this run's last veto check (which follows the If-Match to ``deleting``), so the blob is
kept. If it reads ``deleting`` or nothing, it waits for the mark to go and re-creates
the blob. This closes a race PROTOCOL §3.5 leaves open (`protocol.records.GcMark`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from protocol import keys, records
from reconciler.gc.bounded import for_each_bounded
from reconciler.gc.candidates import OrphanFile
from reconciler.gc.catalog_since import references_since
from reconciler.gc.delete import NS, DeleteOutcome, LeaseTerm, delete_within_lease
from reconciler.gc.log import RunLog
from reconciler.gc.policy import GcRefused
from reconciler.gc.proof import TargetedProof, Verdict
from reconciler.gc.work import GcWork, log
from store.errors import ConditionConflict, Unavailable


@dataclass(frozen=True, slots=True)
class Candidate:
    mark_key: str
    mark: records.GcMark
    last_modified_ns: int
    by_retention: bool
    size: int | None = None
    """Its listed (or HEAD) size: rule 7 reads no object larger than a valid one."""


class Deleter:
    def __init__(
        self,
        work: GcWork,
        *,
        audit: records.AuditRecord,
        proof: TargetedProof,
        run_log: RunLog,
        recently_referenced: Callable[[str], bool],
        store_now_ns: Callable[[], int],
        dry_run: bool,
    ) -> None:
        self._work = work
        self._audit = audit
        self._proof = proof
        self._run_log = run_log
        self._recently_referenced = recently_referenced
        self._store_now_ns = store_now_ns
        self._dry_run = dry_run
        self.stalled: str | None = None
        """Why this run's catalog read proved nothing (`catalog_since.STALL_REASONS`)."""

    async def withdraw(self, mark_key: str) -> None:
        if not self._dry_run:
            await self._work.per_item("withdraw", mark_key, self._work.withdraw(mark_key))

    async def select(
        self, eligible: list[tuple[str, records.GcMark]], orphans: OrphanFile
    ) -> list[Candidate]:
        """Rules 1, 2 (the orphan file), 4 and 5; withdraws the marks they disprove."""
        work, audit = self._work, self._audit
        chosen: list[Candidate] = []

        async def one(item: tuple[str, records.GcMark]) -> None:
            mark_key, mark = item
            audit_after_mark = audit.started_at_unix_ns > mark.marked_at_unix_ns
            # An Inventory report (gc.inventory_proves) may still list an object deleted
            # shortly before it: its presence is checked by a HEAD (rule 1's other way).
            listed_after_mark = audit_after_mark and audit.source == "listing"
            found = orphans.get(mark.frame_sha256)
            if found is None:
                if audit_after_mark:  # referenced, gone or young in a listing after it
                    await self.withdraw(mark_key)
                return  # else: wait for an audit that listed after the mark
            if mark.frame_sha256 in work.vetoes:
                await self.withdraw(mark_key)
                return
            size, last_modified, by_retention = found
            if not listed_after_mark:  # rule 1: a HEAD made after the mark
                info = await work.head(mark.raw_blob_key)
                if info is None:
                    await self.withdraw(mark_key)
                    return
                last_modified, size = info.last_modified_ns, info.size
            horizon = work.policy.audit_horizon_ns(audit)
            if horizon is None or last_modified + horizon >= audit.started_at_unix_ns:
                return  # rule 5: wait for an audit through the blob's age horizon
            chosen.append(Candidate(mark_key, mark, last_modified, by_retention, size))

        await for_each_bounded(
            eligible,
            lambda item: work.per_item("select", item[0], one(item)),
            work.policy.concurrency,
        )
        return sorted(chosen, key=lambda c: c.mark_key)

    async def prove(self, chosen: list[Candidate]) -> list[Candidate] | None:
        """Rule 2's catalog read and rule 7's first proof: the proven candidates, or None
        when the catalog read cannot be trusted (the run deletes nothing)."""
        work, audit = self._work, self._audit
        assert audit.catalog_created_from is not None
        since = await references_since(
            work.store,
            audit.catalog_created_from,
            {c.mark.frame_sha256 for c in chosen},
            by_retention=frozenset(c.mark.frame_sha256 for c in chosen if c.by_retention),
            chunk=work.policy.concurrency,
            bundle_keys={
                c.mark.raw_blob_key: c.mark.frame_sha256
                for c in chosen
                if c.mark.raw_blob_key.startswith(keys.RAW_BUNDLES_PREFIX)
            },
        )
        if since.untrusted is not None:
            log.error(
                "gc_catalog_read_untrusted",
                reason=since.untrusted,
                stalled=since.stalled,
                candidates=len(chosen),
                relists=since.relists,
            )
            self.stalled = since.stalled
            work.observe(f"stalled:{since.stalled}", 1)
            return None
        if since.covered_gone:
            log.info(
                "gc_catalog_read_covered",
                files_read=since.files_read,
                compacted_meanwhile=since.covered_gone,
                relists=since.relists,
            )
        proven: list[Candidate] = []

        async def one(candidate: Candidate) -> None:
            if candidate.mark.frame_sha256 in since.referenced:
                await self.withdraw(candidate.mark_key)
                return
            proof = await self._proof.prove(
                candidate.mark.raw_blob_key,
                by_retention=candidate.by_retention,
                size=candidate.size,
            )
            if proof.verdict is Verdict.WITHDRAW:
                log.info("gc_proof_withdraws", key=candidate.mark_key, why=proof.why)
                await self.withdraw(candidate.mark_key)
            elif proof.verdict is Verdict.PROVEN:
                proven.append(candidate)

        await for_each_bounded(
            chosen,
            lambda c: work.per_item("prove", c.mark_key, one(c)),
            work.policy.concurrency,
        )
        return sorted(proven, key=lambda c: c.mark_key)

    async def guard(self, proven: list[Candidate]) -> None:
        """Refuse deleting more than the allowed fraction of the blobs the audit listed."""
        work = self._work
        planned = sum(not c.by_retention for c in proven)
        total = self._audit.blobs_listed
        if not planned or planned <= work.policy.max_delete_fraction * total:
            return
        detail = (
            f"would delete {planned} of {total} raw blobs, more than gc.max_delete_fraction = "
            f"{work.policy.max_delete_fraction}; nothing was deleted"
        )
        log.error("gc_deletion_guard", planned=planned, total=total)
        problem = records.ProblemRecord(
            kind="gc-guard",
            subject_key=keys.RAW_BLOBS_PREFIX,
            detail=detail,
            first_seen_unix_ns=work.clock.now_ns(),
            last_seen_unix_ns=work.clock.now_ns(),
        )
        await work.store.put(keys.problem_key("gc-guard", keys.RAW_BLOBS_PREFIX), problem.to_json())
        work.observe("guard_refusals", 1)
        raise GcRefused(detail)

    async def delete_one(self, candidate: Candidate) -> bool:
        work = self._work
        mark_key, sha = candidate.mark_key, candidate.mark.frame_sha256
        # The lease recorded below is the deadline the DELETE works to: start it long.
        await work.fence(min_remaining_s=work.policy.lease_a_delete_needs_s)
        current, etag = await work.read_mark(mark_key)
        if current is None or current.state != "marked" or etag is None:
            return False
        lease = work.lease()
        deleting = current.model_copy(
            update={
                "state": "deleting",
                "deleting_since_unix_ns": work.clock.now_ns(),
                "lease_epoch": lease.epoch,
                "lease_expires_at_unix_ns": lease.expires_at_unix_ns,
                # What the proof rests on now (a mark of either reason is proven afresh).
                "reason": "raw-retention" if candidate.by_retention else "orphan",
            }
        )
        deleting_etag = await work.write_deleting(mark_key, deleting, etag)
        if deleting_etag is None:
            return False  # changed under us, or unknown: the stale-deletion pass resolves it
        try:
            # The last checks come after "deleting" is visible: see the module docstring.
            if await work.exists(keys.gc_veto_key(sha)) or self._recently_referenced(sha):
                work.observe("vetoes", 1)
                await work.release_unsent(mark_key, deleting_etag)
                return False
            again = await self._proof.prove(
                candidate.mark.raw_blob_key,
                by_retention=candidate.by_retention,
                size=candidate.size,
            )
        except (Unavailable, ConditionConflict):
            # No DELETE was sent: take the mark back now rather than leave collectors
            # waiting until the lease it records has expired (the stale-deletion pass).
            await work.release_unsent(mark_key, deleting_etag)
            raise
        if again.verdict is not Verdict.PROVEN:
            log.info("gc_second_proof_fails", key=mark_key, why=again.why)
            await work.release_unsent(mark_key, deleting_etag)
            return False
        recorded = await self._record_a_lease_long_enough(mark_key, deleting, deleting_etag, lease)
        if recorded is None:
            return False  # unknown: the mark stays "deleting", the stale-deletion pass
        lease, deleting_etag = recorded
        await work.fence()
        deleted = await delete_within_lease(
            work.delete_store,
            candidate.mark.raw_blob_key,
            expires_in_s=work.policy.delete_expiry_s,
            lease_expires_at_unix_ns=lease.expires_at_unix_ns,
            now_ns=self._store_now_ns,
            max_clock_skew_s=work.policy.max_clock_skew_s,
            max_network_delay_s=work.policy.max_network_delay_s,
            skewed=lambda: work.clock.skewed,
        )
        if deleted is DeleteOutcome.UNKNOWN:
            log.warning("gc_delete_unsettled", key=candidate.mark.raw_blob_key)
            return False  # the mark stays "deleting"; the stale-deletion pass settles it
        if deleted is not DeleteOutcome.DELETED:
            # Nothing was (or can be) applied: withdraw the mark so collectors stop waiting.
            log.warning(
                "gc_delete_not_applied", key=candidate.mark.raw_blob_key, outcome=deleted.value
            )
            await work.fence()
            await work.delete_mark_if_unchanged(mark_key, deleting_etag)
            return False
        entry = records.GcLogEntry(
            frame_sha256=sha,
            raw_blob_key=candidate.mark.raw_blob_key,
            blob_last_modified_ns=candidate.last_modified_ns,
            marked_at_unix_ns=candidate.mark.marked_at_unix_ns,
            audit_started_at_unix_ns=self._audit.started_at_unix_ns,
            deleted_at_unix_ns=work.clock.now_ns(),
            gc_run_id=candidate.mark.gc_run_id,
            reason=deleting.reason,
        )
        self._run_log.add(entry, mark_key, None)  # the mark goes once the log holds this
        return True

    async def _record_a_lease_long_enough(
        self, mark_key: str, deleting: records.GcMark, etag: str, recorded: LeaseTerm
    ) -> tuple[LeaseTerm, str] | None:
        """The lease the DELETE works to and the mark's ETag; None when re-recording it
        did not (or may not have) landed.

        A bundle's second proof reads about two manifests per frame: it can outlast what
        the lease recorded on the ``deleting`` mark has left for a signed DELETE
        (`GcPolicy.lease_a_delete_needs_s`), and a DELETE discarded unsent withdraws the
        mark: the bundle waited a whole audit cycle more (bench.gc, 980 of 1,000). Then
        our lease, renewed, is recorded on the mark first (If-Match on our own mark,
        awaited before anything is signed). Safe: the mark stays ``deleting`` with our
        epoch; a successor exists only after our current lease expires, which the DELETE
        lands before; and the stale-deletion pass waits past the expiry recorded, which
        is the one the DELETE works to (`reconciler.gc.delete`, step 3)."""
        work = self._work
        needs_ns = int(work.policy.lease_a_delete_needs_s * NS)
        if recorded.expires_at_unix_ns - self._store_now_ns() >= needs_ns:
            return recorded, etag
        await work.fence(min_remaining_s=work.policy.lease_a_delete_needs_s)
        current = work.lease()
        if current.expires_at_unix_ns <= recorded.expires_at_unix_ns:
            return recorded, etag  # nothing longer to record: the DELETE is discarded
        renewed = deleting.model_copy(
            update={
                "lease_epoch": current.epoch,
                "lease_expires_at_unix_ns": current.expires_at_unix_ns,
            }
        )
        new_etag = await work.write_deleting(mark_key, renewed, etag)
        if new_etag is None:
            return None
        work.observe("lease_rerecorded", 1)
        return current, new_etag
