"""``[ingest]``: the acceptance protocol (PROTOCOL §3): the collector's identity, frame
limits, the request budget, the index log buffer, local spool mode and group commit
(bundles, PROTOCOL §3.10). Part of `config.settings` (``Settings.ingest``)."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from config.errors import CrossFieldError
from config.section import AbsolutePath, MiB, Seconds, Section

SINGLE_PUT_LIMIT_BYTES = 5 * 1024 * MiB
"""The largest body one PutObject may carry (S3: 5 GiB). Every raw object is written
with one conditional PutObject, never a multipart upload (PROTOCOL §3.10)."""


def _default_collector_id() -> str:
    host = re.sub(r"[^A-Za-z0-9._-]+", "-", socket.gethostname()).strip("-.") or "collector"
    return f"{host[:100]}-{os.getpid()}"


CollectorId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")]


class IngestSettings(Section):
    """``[ingest]``: the acceptance protocol (PROTOCOL.md §3)."""

    collector_id: CollectorId = Field(default_factory=_default_collector_id)
    """Recorded in every manifest this collector writes; default ``<hostname>-<pid>``."""
    acceptance: Literal["s3_manifest", "local_spool"] = "s3_manifest"
    max_frame_bytes: int = Field(default=8 * MiB, ge=64, le=2**32 - 1)
    """Larger request bodies are refused with 413 before being read."""
    max_raw_bytes: int = Field(default=64 * MiB, ge=1, le=2**32 - 1)
    """Cap on a frame's decompressed payload (``payload_raw_len``); larger is 400."""
    request_budget_s: Seconds = 10.0
    """Time the store protocol may take for one request before answering 503."""
    index_flush_rows: int = Field(default=5_000, ge=1)
    """Write the index log buffer as segments once it holds this many rows (PROTOCOL §3.7)."""
    index_flush_max_age_ms: int = Field(default=1000, ge=1)
    """... or once its oldest row is this old. Segments per hour ≈ writers x flushes:
    choose it so that (segments + catalog files + markers) ÷ batches stays ≤ 0.05."""
    index_put_budget_s: Seconds = 60.0
    """The longest a log segment's create may take from its cut to its landing, retries
    included (PROTOCOL §3.7; its rows are cut again after): readers' lookbacks must be at
    least ``store.max_clock_skew_s`` plus this (checked when settings load)."""
    index_buffer_rows: int = Field(default=100_000, ge=1)
    """Rows the index log buffer holds at most; further rows are dropped and counted (the
    reconciler's full audit finds their records)."""
    spool_dir: AbsolutePath = Path("./lm-spool")
    """``local_spool`` mode: where acknowledged frames are fsync'd before landing."""
    object_landing_interval_ms: int = Field(default=1000, ge=1)
    """``local_spool`` mode: how often spooled batches are landed in the store."""
    spool_max_bytes: int = Field(default=1024 * MiB, ge=1)
    """``local_spool`` mode: past this many spooled bytes, answer 503 until landing catches up."""
    spool_landed_max_entries: int = Field(default=10_000_000, ge=1)
    """``local_spool`` mode: landed identities remembered (for ``gc.retry_horizon_s``) to
    answer a later conflicting frame 409; about 95 bytes each on disk. Past it the oldest
    are forgotten early (logged): size it for landed batches/s times the horizon."""
    probe_on_start: bool = True
    """Run the conditional-write probe (PROTOCOL.md §3.6) before serving."""
    bundle: bool = True
    """Group commit (PROTOCOL §3.10): frames that arrive while this process's raw writes
    are in flight share one raw object, a bundle (1 + 1/n PUTs a batch for bundles of n).
    In effect once the store's feature record (``index/v1/features.json``) says
    ``bundles: true``; a quiet collector writes one frame blob a batch as before. In
    ``local_spool`` mode a landing round writes its spooled frames as bundles."""
    bundle_max_in_flight: int = Field(default=2, ge=1, le=64)
    """Raw writes (bundles or frame blobs of the bundler) in flight at once per process;
    the open bundle is sent as soon as fewer are."""
    bundle_eager_frames: int = Field(default=8, ge=0, le=1_000_000)
    """... and an open bundle of this many frames is sent at once, even while every slot
    is busy (0: only the slots, PROTOCOL §3.10's rule). Such a write carries at least
    this many frames, so it costs at most 1/n PUT a frame, and a frame at a busy
    collector need not wait a raw write's time for a slot (issue 33's latency target;
    `collector.bundles.bundler.BundleLimits.eager_frames`). 1 is refused: it would send
    every frame alone."""
    bundle_max_bytes: int = Field(default=8 * MiB, ge=1)
    """A bundle closes once its frames reach this many bytes (the frame that reaches it
    may add up to ``max_frame_bytes``)."""
    bundle_max_frames: int = Field(default=1000, ge=1, le=1_000_000)
    """... or this many frames. A full bundle waits for a write slot; new frames are then
    refused 429."""

    @field_validator("bundle_eager_frames")
    @classmethod
    def _eager_bundles_bundle(cls, frames: int) -> int:
        if frames == 1:
            raise ValueError(
                "must be 0 (only the write slots) or at least 2 (1 would send every frame alone)"
            )
        return frames

    @model_validator(mode="after")
    def _bundle_fits_one_put(self) -> IngestSettings:
        largest = self.largest_raw_object_bytes()
        if largest > SINGLE_PUT_LIMIT_BYTES:
            raise CrossFieldError(
                "ingest.bundle_max_bytes",
                f"the largest raw object, ingest.bundle_max_bytes + ingest.max_frame_bytes "
                f"+ 44 x ingest.bundle_max_frames + 12 = {largest}, must fit one PutObject "
                f"({SINGLE_PUT_LIMIT_BYTES} bytes; PROTOCOL §3.10)",
                related=("ingest.max_frame_bytes", "ingest.bundle_max_frames"),
            )
        return self

    def largest_raw_object_bytes(self) -> int:
        """The largest raw object this collector writes (PROTOCOL §3.10): a frame blob of
        ``max_frame_bytes``, or with bundles the largest bundle; the size the §3.6 probe
        sends in its conditional PutObject."""
        if not self.bundles_configured:
            return self.max_frame_bytes
        # protocol.bundle.max_bundle_bytes (config imports nothing of protocol; a test
        # holds the two equal): the frame that closes a bundle, then 44 bytes of index
        # per frame and the 12-byte footer.
        return self.bundle_max_bytes + self.max_frame_bytes + 44 * self.bundle_max_frames + 12

    @property
    def bundles_configured(self) -> bool:
        """Bundles are asked for (both modes: spool mode lands windows of spooled frames
        as bundles, `collector.bundles.spool_landing`)."""
        return self.bundle
