"""An accepted batch's frame as the rollup reads it: the one definition of a raw blob the
rollup cannot read (`BadFrame`: missing, another hash, undecodable, another batch) and
the largest decoded payload it accepts. Used by the job's stage 1 and by
``lm-rollup acknowledge-lost`` (`rollup.lifecycle.lost`)."""

from __future__ import annotations

import hashlib
from typing import Any

import pyarrow as pa

from protocol import keys
from protocol.frame import Frame, FrameError, decode_frame
from rollup.table.points import PointsError, points_rows

MAX_RAW_BYTES = 64 * 1024 * 1024
"""The largest decoded payload a frame the rollup reads may declare."""


class BadFrame(Exception):
    """A batch whose raw blob can never be read as it: ``kind`` is ``missing-blob`` or
    ``corrupt-blob`` (the rollup's problem kinds; `rollup.lifecycle.lost` acknowledges such a
    batch as lost)."""

    def __init__(self, kind: str, subject_key: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.subject_key = subject_key
        self.detail = detail

    def as_dict(self, item: dict[str, Any]) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "subject_key": self.subject_key,
            "detail": f"{self.detail} (accepted batch {item['manifest_id']})",
            "manifest_id": item["manifest_id"],
            "accepted_hour": item["accepted_hour"],
        }


def check_frame(
    data: bytes | None, *, blob_key: str, frame_sha256: str, manifest_id: str, max_raw_bytes: int
) -> tuple[Frame, pa.Table]:
    """The frame in ``data`` (None: the blob does not exist) and its ``points`` rows, if
    it is the batch ``manifest_id`` with hash ``frame_sha256``; else `BadFrame`. The one
    definition of a blob the rollup cannot read."""
    if data is None:
        raise BadFrame("missing-blob", blob_key, "the raw blob does not exist")
    actual = hashlib.sha256(data).hexdigest()
    if actual != frame_sha256:
        raise BadFrame(
            "corrupt-blob", blob_key, f"sha256 is {actual}, the manifest says {frame_sha256}"
        )
    try:
        frame = decode_frame(data, max_raw_bytes=max_raw_bytes)
        identity = keys.BatchIdentity(frame.agent_id, frame.boot_id, frame.seq_start, frame.seq_end)
        if identity.manifest_id != manifest_id:
            # PROTOCOL §3.7: a catalog row (a phantom's, say) naming another batch's frame;
            # never counted, and never acknowledged as lost (not a `LOST_PROBLEMS` kind).
            raise BadFrame(
                "identity-mismatch", blob_key, f"the frame is batch {identity.manifest_id}"
            )
        return frame, points_rows(frame)
    except (FrameError, PointsError) as exc:
        raise BadFrame("corrupt-blob", blob_key, f"undecodable: {exc}") from None
