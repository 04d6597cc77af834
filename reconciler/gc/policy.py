"""What a GC run is told (`GcPolicy`), what it reports (`GcOutcome`), and `GcRefused`."""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol import records

NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class GcPolicy:
    retry_horizon_s: float
    mark_grace_s: float
    max_delete_fraction: float = 0.1
    settle_s: float = 120.0
    max_item_errors: int = 100
    delete_expiry_s: int = 5
    """Lifetime of each signed blob DELETE (`reconciler.gc.delete`)."""
    max_clock_skew_s: float = 0.0
    """Bound on the distance between the deleter's clock and store time."""
    max_network_delay_s: float = 0.0
    """The longest a request may take to reach the store (rule 6: the signed DELETE's
    deadline plus this must fall before the recorded lease expiry)."""
    max_frame_bytes: int = 8 * 1024 * 1024
    """No valid blob is larger (``ingest.max_frame_bytes``): rule 7 reads a candidate
    whole only up to this; a larger one is a ``corrupt-blob`` problem, never deleted."""
    max_bundle_bytes: int = 0
    """The largest valid bundle (PROTOCOL §3.10, ``ingest.largest_raw_object_bytes`` with
    bundles): rule 7 reads a bundle whole only up to this, a larger one is a
    ``corrupt-blob`` problem; 0: ``max_frame_bytes``."""
    inventory_lag_s: float | None = None
    """``gc.inventory_lag_s`` when ``gc.inventory_proves``: an audit read from an S3
    Inventory report then serves as the rule-5 audit for blobs older than the report by
    the horizon plus this; None: such an audit proves nothing (the default)."""
    concurrency: int = 1
    """Marks, mark reads, proofs and deletions in flight at once (``gc.concurrency``):
    each blob's steps are independent of every other blob's, and `for_each_bounded`
    cancels the rest on an error that ends the run (every step leaves a state a later run
    resolves, see `reconciler.gc`)."""

    def __post_init__(self) -> None:
        if not 0 < self.max_delete_fraction <= 1:
            raise ValueError(
                f"max_delete_fraction must be in (0, 1], got {self.max_delete_fraction}"
            )
        if self.retry_horizon_s <= 0 or self.mark_grace_s <= 0 or self.settle_s < 0:
            raise ValueError("retry_horizon_s and mark_grace_s must be > 0, settle_s >= 0")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.max_item_errors < 0:
            raise ValueError(f"max_item_errors must be >= 0, got {self.max_item_errors}")
        if self.delete_expiry_s < 1 or self.max_clock_skew_s < 0:
            raise ValueError("delete_expiry_s must be >= 1 and max_clock_skew_s >= 0")
        if self.inventory_lag_s is not None and self.inventory_lag_s < 0:
            raise ValueError(f"inventory_lag_s must be >= 0, got {self.inventory_lag_s}")
        if self.max_network_delay_s < 0 or self.max_frame_bytes < 1 or self.max_bundle_bytes < 0:
            raise ValueError(
                "max_network_delay_s and max_bundle_bytes must be >= 0, max_frame_bytes >= 1"
            )
        settle = self.lease_a_delete_needs_s
        if self.settle_s < settle:
            raise ValueError(
                f"settle_s must cover delete_expiry_s + max_clock_skew_s + "
                f"max_network_delay_s = {settle:g}, got {self.settle_s:g}"
            )

    @property
    def lease_a_delete_needs_s(self) -> float:
        """How long the recorded lease must still run when a signed DELETE is signed for
        it to be sent (`reconciler.gc.delete`, step 2: its expiry, a signer clock ahead by
        the skew bound, the network delay); also how long a resolver waits past it."""
        return self.delete_expiry_s + self.max_clock_skew_s + self.max_network_delay_s

    @property
    def grace_ns(self) -> int:
        return int(self.mark_grace_s * NS)

    @property
    def horizon_ns(self) -> int:
        return int(self.retry_horizon_s * NS)

    def audit_horizon_ns(self, audit: records.AuditRecord) -> int | None:
        """How much older than ``audit``'s start a blob must be for the audit to prove it
        (rule 5): the retry horizon after a listing; plus ``inventory_lag_s`` after an
        Inventory report; None when the audit proves nothing."""
        if audit.source == "listing":
            return self.horizon_ns
        if self.inventory_lag_s is None:
            return None
        return self.horizon_ns + int(self.inventory_lag_s * NS)


class GcRefused(Exception):
    """The deletion guard refused the run; nothing was deleted. Investigate before retrying."""


@dataclass
class GcOutcome:
    record: records.GcRunRecord
    would_delete: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    deleted_raw_retention: int = 0
    stalled: str | None = None
