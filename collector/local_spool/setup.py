"""Assembling ``local_spool`` mode from settings (`collector.server.Worker` calls it)."""

from __future__ import annotations

from config import Settings
from protocol.clock import Clock
from store.base import ObjectStore

from ..accept import BatchAcceptor
from ..startup_checks import StartupError
from .landed import LandedMemoryError
from .lander import SpoolLander
from .spool import LocalSpool


def build_local_spool(
    settings: Settings, *, acceptor: BatchAcceptor, store: ObjectStore, clock: Clock
) -> tuple[LocalSpool, SpoolLander]:
    """The spool and its lander. The spool refuses new frames while this host's clock is
    off the store's (`BatchAcceptor.refuse_if_clock_skewed`): their landing would wait for
    this clock (PROTOCOL §3.8), so the agent had better go to another collector now.
    `StartupError` when the landed memory cannot be used."""
    ingest = settings.ingest
    try:
        spool = LocalSpool(
            ingest.spool_dir,
            max_pending_bytes=ingest.spool_max_bytes,
            retry_horizon_s=settings.gc.retry_horizon_s,
            max_landed=ingest.spool_landed_max_entries,
            refuse_new=acceptor.refuse_if_clock_skewed,
        )
    except LandedMemoryError as exc:
        raise StartupError(str(exc)) from None
    lander = SpoolLander(
        spool=spool,
        acceptor=acceptor,
        store=store,
        clock=clock,
        interval_s=ingest.object_landing_interval_ms / 1000,
        send_window_s=settings.spool_send_window_s(),
    )
    return spool, lander
