"""What the receivers need from the collector that hosts them (`ReceiverHost`).

The receivers depend on the acceptance core (acceptor, spool, caps, metrics), never on
the HTTP application that assembles it: `collector.app.CollectorApp` satisfies this
protocol and registers the receivers' routes (`collector.receivers.add_receiver_routes`).
"""

from __future__ import annotations

from typing import Protocol

from config.settings import ReceiverSettings

from ..accept import BatchAcceptor
from ..auth import Authenticator
from ..frame_checks import FrameChecker
from ..intake import HttpLimits
from ..local_spool.spool import LocalSpool
from ..metrics import CollectorMetrics
from ..readiness import Readiness


class ReceiverHost(Protocol):
    """The collector's parts a receiver uses, and its in-flight account."""

    acceptor: BatchAcceptor
    authenticator: Authenticator
    metrics: CollectorMetrics
    readiness: Readiness
    limits: HttpLimits
    collector_id: str
    spool: LocalSpool | None
    receivers: ReceiverSettings
    frame_checker: FrameChecker

    def admit(self, body_bytes: int) -> bool:
        """Count one more request holding ``body_bytes`` under the in-flight caps, or
        refuse it (False)."""
        ...

    def admit_bytes(self, size: int) -> bool:
        """Reserve ``size`` more bytes for an admitted request, or refuse (False)."""
        ...

    def release(self, requests: int, size: int) -> None:
        """Give back what `admit` / `admit_bytes` reserved."""
        ...
