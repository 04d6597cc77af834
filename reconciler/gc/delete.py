"""The GC's last step, a DELETE that cannot land late (PROTOCOL §3.5 rule 6), and when a
``deleting`` mark may be resolved (the epoch rule).

The race this closes: a GC leader turns a mark ``deleting``, then stalls (retried store
calls, a pause) past its lease. A successor takes the lease, finds the stale ``deleting``
mark, resolves it (the blob is still there), a collector's re-send is acknowledged against
that blob, and then the old leader's DELETE lands: a referenced blob is gone.

1. **The mark records its lease.** When it turns ``deleting`` it records the lease epoch
   and that lease's expiry as it stood then (`protocol.records.GcMark`). Later renewals
   do not move that instant: it is the deadline this deletion works to.
2. **One signed request, sent once.** The DELETE is pre-signed with an expiry of
   ``expires_in_s`` (E) and never re-signed or repeated. Nothing is signed while this
   process's clock is off the store's by more than ``max_clock_skew_s`` (`skewed`: the
   signature's date comes from the local clock). *After* signing, it is sent only if
   (a) the recorded lease expiry is at least E + ``max_clock_skew_s`` away in store time,
   and (b) the request's own deadline — the literal ``X-Amz-Date`` + E, which the store
   compares with its own clock, so it is already a store-clock instant whatever the
   signer's clock said (`SignedDelete.expires_at_unix_ns`, never earlier than it) — plus
   the longest network delay is before the recorded lease expiry; otherwise it is
   discarded unsent. (b) is what makes a signer whose clock runs ahead harmless: its
   ``X-Amz-Date`` lies in the future and the store would take the request that much
   longer. The store refuses it once its clock passes that deadline, so it lands before
   the recorded lease expiry or not at all: a deleter that lost its lease (which only
   happens after that expiry) can no longer delete.
3. **Nobody resolves the mark early.** A ``deleting`` mark is resolved only after
   ``max(deleting_since, recorded lease expiry) + settle_s``, where ``settle_s`` covers E,
   the clock skew and the longest network delay; by then its DELETE has landed or never
   will. This holds for marks of older epochs (PROTOCOL's rule) and of our own (a DELETE
   of ours whose outcome is unknown). A mark without the lease fields was written by code
   that sent unsigned DELETEs under an older lease, which had expired by the time ours
   began: it waits ``settle_s`` past the start of our term (nothing can bound an
   unsigned DELETE that is still in flight; this is the conservative reading).

Time: ``now_ns`` is store time (PROTOCOL §3.8); ``max_clock_skew_s`` bounds how far the
signer's clock (S3's ``X-Amz-Date``) may be from it, and ``skewed`` says when that bound
is known broken (`store.time.StoreClock.skewed`); all are injected by the caller.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from protocol import records
from store.base import ObjectStore
from store.errors import ConditionConflict, OutcomeUnknown, RequestExpired, Unavailable

NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class LeaseTerm:
    """The reconciler lease a GC run works under, as the deletion needs it."""

    epoch: int
    expires_at_unix_ns: int
    """The current expiry (store time); renewals move it on."""
    started_at_unix_ns: int
    """When this term began: every older lease had expired by then."""


class DeleteOutcome(enum.Enum):
    SKEWED = "skewed"
    """Nothing signed: this process's clock is off the store's beyond the limit."""
    DELETED = "deleted"
    DISCARDED = "discarded"
    """Signed but never sent: the recorded lease would not outlive the request."""
    REFUSED = "refused"
    """Sent and refused (expired, throttled, never connected): nothing was applied."""
    UNKNOWN = "unknown"
    """Sent; it may have been applied. It cannot land after its expiry."""


async def delete_within_lease(
    store: ObjectStore,
    key: str,
    *,
    expires_in_s: int,
    lease_expires_at_unix_ns: int,
    now_ns: Callable[[], int],
    max_clock_skew_s: float,
    max_network_delay_s: float,
    skewed: Callable[[], bool],
) -> DeleteOutcome:
    """Delete ``key`` with one signed request that expires before the recorded lease
    (``lease_expires_at_unix_ns``, store time) does (step 2 of the module docstring).
    Errors other than the outcomes above (a configuration error, say) propagate; nothing
    was applied then either."""
    if skewed():
        return DeleteOutcome.SKEWED
    signed = await store.sign_delete(key, expires_in_s=expires_in_s)
    # Read after signing: the request was signed no later than this instant.
    left_ns = lease_expires_at_unix_ns - now_ns()
    if left_ns < int((expires_in_s + max_clock_skew_s) * NS):
        return DeleteOutcome.DISCARDED
    if signed.expires_at_unix_ns + int(max_network_delay_s * NS) >= lease_expires_at_unix_ns:
        return DeleteOutcome.DISCARDED  # the store would take it past the recorded lease
    try:
        await store.send_signed_delete(signed)
    except OutcomeUnknown:
        return DeleteOutcome.UNKNOWN
    except (RequestExpired, Unavailable, ConditionConflict):
        return DeleteOutcome.REFUSED
    return DeleteOutcome.DELETED


def resolvable_at_ns(mark: records.GcMark, *, settle_s: float, term_started_at_unix_ns: int) -> int:
    """When a ``deleting`` mark may be resolved without deleting again (step 3)."""
    since = mark.deleting_since_unix_ns or mark.marked_at_unix_ns
    if mark.lease_expires_at_unix_ns is not None:
        bound = max(since, mark.lease_expires_at_unix_ns)
    else:
        bound = max(since, term_started_at_unix_ns)
    return bound + int(settle_s * NS)
