"""What `collector.accept.BatchAcceptor` is given to bundle (PROTOCOL §3.10 "Writing")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from config import Settings

from ..metrics import CollectorMetrics
from .bundler import BundleLimits


def _never() -> bool:
    return False


@dataclass(frozen=True, slots=True)
class BundleOptions:
    limits: BundleLimits = field(default_factory=BundleLimits)
    enabled: Callable[[], bool] = _never
    """The store's feature gate: True once ``index/v1/features.json`` says ``bundles:
    true`` (`index.features.BundleGate.bundles_enabled`). Asked for every frame: until it
    says so, nothing changes (frame blobs, 2 PUTs a batch)."""
    points_retention_s: float | None = None
    """``[rollup] retention_points_days`` in seconds: a frame whose newest point is older
    is not bundled (its hour will never be rolled up, so it must not pin a bundle)."""
    on_raw_put: Callable[[int], None] | None = None
    """``lm_collector_frames_per_raw_put``: a raw object of n frames is being written."""
    on_slot_wait: Callable[[float], None] | None = None
    """``lm_collector_bundle_slot_wait_seconds``: how long a bundled frame waited from
    joining the open bundle until its raw object was being written."""
    on_dead_bytes: Callable[[int], None] | None = None
    """``lm_collector_bundle_dead_bytes_total``: bytes of a bundled frame no manifest
    names (a duplicate, or the submitted frame of a conflict)."""

    def bundles(self, *, resend: bool, ts_range: tuple[int, int] | None, now_ns: int) -> bool:
        """Whether this frame joins the open bundle: the gate is on, and it is not a
        flagged re-send nor older than the ``points`` retention (PROTOCOL §3.10 "Not
        bundled"; the submitted frame of a conflict is written as a frame blob by the
        conflict path itself)."""
        if resend or not self.enabled():
            return False
        if self.points_retention_s is not None and ts_range is not None:
            oldest_kept_ns = now_ns - int(self.points_retention_s * 1e9)
            if ts_range[1] < oldest_kept_ns:
                return False
        return True


def bundle_options(
    settings: Settings, enabled: Callable[[], bool], metrics: CollectorMetrics
) -> BundleOptions | None:
    """The collector's group commit from its settings (``[ingest] bundle*``), in effect
    while ``enabled()`` (the store's feature gate) says so; None when not configured
    (``bundle = false``: frame blobs only)."""
    ingest = settings.ingest
    if not ingest.bundles_configured:
        return None
    retention_days = settings.rollup.retention_points_days
    store_timeout_s = settings.store.connect_timeout_s + settings.store.read_timeout_s
    return BundleOptions(
        limits=BundleLimits(
            max_in_flight=ingest.bundle_max_in_flight,
            max_bytes=ingest.bundle_max_bytes,
            max_frames=ingest.bundle_max_frames,
            eager_frames=ingest.bundle_eager_frames,
            send_margin_s=BundleLimits.margin(
                store_timeout_s=store_timeout_s, budget_s=ingest.request_budget_s
            ),
        ),
        enabled=enabled,
        points_retention_s=None if retention_days is None else retention_days * 86_400.0,
        on_raw_put=metrics.frames_per_raw_put.observe,
        on_slot_wait=metrics.bundle_slot_wait.observe,
        on_dead_bytes=metrics.bundle_dead_bytes.inc,
    )
