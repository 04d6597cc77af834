"""One built frame through the collector's acceptance, exactly as ``POST /v1/batches``
lands it: `collector.accept.BatchAcceptor.accept` in strict mode, `collector.local_spool.spool.LocalSpool`
in ``local_spool`` mode, with the same metrics and readiness updates.

Outcomes: `Stored` (new or duplicate), or `StoreUnavailable` (answer a retryable status;
nothing is known). An identity conflict cannot mean other points here: receiver
identities are derived from the points (`collector.receivers.frames`), so the accepted
frame carries the same points in other bytes (another library version encoded it). It
is answered as a duplicate with ``encoding_differs`` set; the acceptor has written the
quarantine record, as for any conflict, so operators still see the pair.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import structlog

from protocol import keys
from protocol.batch_api import STORE_UNAVAILABLE
from protocol.frame import FrameHeader
from store.errors import StoreConfigError

from ..accept import AcceptanceUnavailable, Accepted
from ..local_spool.spool import SpoolFull
from ..store_calls import ClockSkewed
from .host import ReceiverHost

log = structlog.get_logger("collector.receivers")


@dataclass(frozen=True, slots=True)
class Stored:
    """The frame is accepted (a manifest exists) or, in ``local_spool`` mode, durable."""

    header: FrameHeader
    frame_sha256: str
    frame_bytes: int
    manifest_key: str
    duplicate: bool
    encoding_differs: bool = False
    spooled: bool = False

    @property
    def outcome(self) -> str:
        return "duplicate" if self.duplicate else "accepted"


class StoreUnavailable(Exception):
    """The store (or the local spool) could not take the frame now; retrying may work.
    ``error``: the refusal's code, ``store_unavailable``, or `ClockSkewed.code` when this
    host's clock is off the store's (PROTOCOL §3.8: this collector's own refusal)."""

    def __init__(self, detail: str, error: str = STORE_UNAVAILABLE) -> None:
        super().__init__(detail)
        self.error = error


async def land_frame(collector: ReceiverHost, header: FrameHeader, frame: bytes) -> Stored:
    """Accept ``frame`` (whose validated header is ``header``). Raises `StoreUnavailable`."""
    sha = hashlib.sha256(frame).hexdigest()
    identity = keys.BatchIdentity(header.agent_id, header.boot_id, header.seq_start, header.seq_end)
    context = {"agent_id": header.agent_id, "identity": str(identity), "frame_sha256": sha}
    if collector.spool is not None:
        stored = await _spool(collector, identity, header, frame, sha, context)
    else:
        stored = await _accept(collector, header, frame, sha, context)
    if not stored.duplicate:
        collector.metrics.bytes_accepted.inc(len(frame))
        collector.metrics.points_accepted.inc(header.record_count)
    return stored


async def _accept(
    collector: ReceiverHost, header: FrameHeader, frame: bytes, sha: str, context: dict[str, str]
) -> Stored:
    try:
        result = await collector.acceptor.accept(header, frame, sha)
    except (AcceptanceUnavailable, StoreConfigError) as exc:
        code = exc.code if isinstance(exc, ClockSkewed) else STORE_UNAVAILABLE
        if isinstance(exc, StoreConfigError):  # e.g. 403: credentials or bucket policy
            log.error("store_refuses_access", error=str(exc), **context)
        else:
            log.warning(code, error=str(exc), **context)
        raise StoreUnavailable(str(exc), code) from exc
    collector.readiness.store_answered()
    if isinstance(result, Accepted):
        outcome = "duplicate" if result.duplicate else "accepted"
        collector.metrics.store_ops_per_batch.labels(outcome=outcome).observe(result.store_ops)
        return Stored(
            header, sha, len(frame), result.manifest.manifest_key, duplicate=result.duplicate
        )
    collector.metrics.conflicts.inc()
    collector.metrics.store_ops_per_batch.labels(outcome="conflict").observe(result.store_ops)
    log.warning(
        "receiver_encoding_differs",
        accepted_frame_sha256=result.accepted.frame_sha256,
        quarantine_key=result.quarantine_key,
        **context,
    )
    return Stored(
        header,
        sha,
        len(frame),
        result.accepted.manifest_key,
        duplicate=True,
        encoding_differs=True,
    )


async def _spool(
    collector: ReceiverHost,
    identity: keys.BatchIdentity,
    header: FrameHeader,
    frame: bytes,
    sha: str,
    context: dict[str, str],
) -> Stored:
    assert collector.spool is not None
    try:
        answer = await collector.spool.add(identity, sha, frame)
    except ClockSkewed as exc:  # its landing would wait for this clock (§3.8)
        log.warning(exc.code, error=str(exc), **context)
        raise StoreUnavailable(str(exc), exc.code) from exc
    except SpoolFull as exc:
        log.warning("spool_full", error=str(exc), **context)
        raise StoreUnavailable(str(exc)) from exc
    conflict = answer.conflict_sha256 is not None
    if conflict:
        collector.metrics.conflicts.inc()
        log.warning("receiver_encoding_differs", spooled_frame_sha256=answer.conflict_sha256)
    return Stored(
        header,
        sha,
        len(frame),
        keys.accepted_manifest_key(identity),
        duplicate=answer.duplicate or conflict,
        encoding_differs=conflict,
        spooled=True,
    )
