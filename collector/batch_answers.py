"""The answers of ``POST /v1/batches`` that carry a batch (PROTOCOL §2): 200 for a batch
accepted, or already accepted with the same bytes, and 409 for an identity conflict.
One place for their bodies, whichever way the collector took the batch (the store
protocol, or its local spool)."""

from __future__ import annotations

from aiohttp import web

from protocol import keys

from .intake import error_response


def accepted_response(
    identity: keys.BatchIdentity,
    *,
    frame_sha256: str,
    collector_id: str,
    duplicate: bool,
    spooled: bool = False,
) -> web.Response:
    """200: every body carries the identity, the hash, the manifest key and who answered;
    ``spooled`` only in ``local_spool`` mode (durable locally, not yet in the store)."""
    body = {
        "accepted": True,
        "duplicate": duplicate,
        **({"spooled": True} if spooled else {}),
        "agent_id": identity.agent_id,
        "boot_id": str(identity.boot_id),
        "seq_start": identity.seq_start,
        "seq_end": identity.seq_end,
        "frame_sha256": frame_sha256,
        "manifest_key": keys.accepted_manifest_key(identity),
        "collector_id": collector_id,
    }
    return web.json_response(body)


def conflict_response(
    identity: keys.BatchIdentity,
    *,
    accepted_sha256: str,
    submitted_sha256: str,
    quarantine_key: str,
) -> web.Response:
    """409 ``identity_conflict``: the identity was accepted with other bytes; the
    submitted frame is quarantined under ``quarantine_key`` (PROTOCOL §3.3)."""
    return error_response(
        409,
        "identity_conflict",
        None,
        accepted_frame_sha256=accepted_sha256,
        submitted_frame_sha256=submitted_sha256,
        accepted_manifest_key=keys.accepted_manifest_key(identity),
        quarantine_key=quarantine_key,
    )
