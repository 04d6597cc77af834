"""The identity-conflict path of acceptance (PROTOCOL §3.2, §3.3): the quarantine record.

An identity whose accepted manifest names another hash than the submitted frame's ends
here, whichever way the conflict was found (the manifest create answered 412, the
manifest read first for a re-send or after the blob's 412, the long agent form). The
caller has already stored and kept the *submitted* blob (step 1 with the §3.5 collector
side), since the record names it. Then, in this order:

1. hold off any deletion of the *accepted* blob, which the record also names, by the
   whole §3.5 collector side (`blob_survival.keep_accepted_blob`: read its mark, veto a
   ``marked`` one and read it again, wait out a ``deleting`` one, then HEAD the blob),
   on every conflict (with raw retention an accepted blob may be marked or deleted; the
   mark read is one GET otherwise, the HEAD one more). A blob raw retention already
   deleted makes the record say ``accepted_blob_present: false``. An accepted frame that
   lives in a bundle is first copied to its own frame blob, under the collector side of
   that frame blob (`collector.bundles.accepted_copy`): a quarantine record names frame
   blobs only (PROTOCOL §3.10);
2. create the record with If-None-Match; the conflict is answered (409) only once it
   exists (else `BudgetExhausted`: 503, the agent retries and the conflict is found
   again), and its ``quarantine`` row is appended to the index log.

Every create is sent through `BudgetedRequest.call`, which checks the request's deadline
immediately before sending: a hold-off that eats the budget ends the request with no
record created, so the GC's mark grace (rule 3) bounds when the record can land.
"""

from __future__ import annotations

from index.log_writer import IndexLogWriter
from index.rows import quarantine_row
from protocol import keys, records

from .blob_survival import keep_accepted_blob
from .bundles.accepted_copy import copy_accepted_frame
from .store_calls import BudgetedRequest, Created


async def quarantine_conflict(
    request: BudgetedRequest,
    *,
    accepted: records.AcceptedManifest,
    accepted_key: str,
    submitted_sha: str,
    collector_id: str,
    index_log: IndexLogWriter,
    max_frame_bytes: int,
) -> str:
    """Create the quarantine record of this conflict (see the module docstring); returns
    its key. ``max_frame_bytes`` bounds a bundled accepted frame's range before it is
    read. Raises `BudgetExhausted`."""
    if accepted.raw_range is None:
        present = await keep_accepted_blob(
            request, sha=accepted.frame_sha256, collector_id=collector_id
        )
    else:
        present = await copy_accepted_frame(
            request,
            accepted,
            collector_id=collector_id,
            index_log=index_log,
            max_frame_bytes=max_frame_bytes,
        )
    conflict = records.IdentityConflict(
        agent_id=accepted.agent_id,
        boot_id=accepted.boot_id,
        seq_start=accepted.seq_start,
        seq_end=accepted.seq_end,
        accepted_manifest_key=accepted_key,
        accepted_raw_blob_key=keys.raw_blob_key(accepted.frame_sha256),  # never a bundle
        accepted_frame_sha256=accepted.frame_sha256,
        submitted_raw_blob_key=keys.raw_blob_key(submitted_sha),
        submitted_frame_sha256=submitted_sha,
        observed_at_unix_ns=request.clock.now_ns(),
        collector_id=collector_id,
        accepted_blob_present=present,
    )
    created, etag = await request.create_idempotent_etag(
        "put_quarantine", conflict.quarantine_key, conflict.to_json()
    )
    # Only a create answered 200 is ours to attest; an existing record (a conflict found
    # before, with its own observed_at) is read back by the reconciler (PROTOCOL §3.7).
    own = created is Created.YES
    index_log.append(quarantine_row(conflict, etag=etag if own else None, own_create=own))
    return conflict.quarantine_key
