"""Accepted manifests with a range (PROTOCOL §3.10 "Records"): the bundled form parses
only for a reader that reads bundles; a record without a range is read and written
exactly as before and means the whole frame blob of its hash."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from pydantic import ValidationError

from protocol import bundle as bd
from protocol import keys, records
from tests.protocol import bundle_vectors as bv

OLD = (
    '{"schema":"lightmetrics.accepted_batch.v1","agent_id":"agent-a",'
    '"boot_id":"5f0c6b1e-9a4d-4c1e-8f3a-0123456789ab","seq_start":10,"seq_end":10,'
    '"record_count":1,"frame_sha256":"SHA","frame_bytes":1031,"raw_blob_key":"KEY",'
    '"accepted_at_unix_ns":1760000000000000000,"collector_id":"collector-1",'
    '"wire_version":1,"frame_version":1}'
)


def _frame_and_sha() -> tuple[bytes, str]:
    frame = bv.golden_frames()[0]
    return frame, hashlib.sha256(frame).hexdigest()


def test_a_record_without_a_range_is_unchanged() -> None:
    frame, sha = _frame_and_sha()
    text = OLD.replace("SHA", sha).replace("KEY", keys.raw_blob_key(sha))
    for reads_bundles in (False, True):
        manifest = records.AcceptedManifest.from_json(text, reads_bundles=reads_bundles)
        assert manifest.raw_range is None
        assert manifest.to_json() == text.encode()  # byte for byte: no null range fields
    built = records.AcceptedManifest.of_frame(
        frame, accepted_at_unix_ns=1_760_000_000_000_000_000, collector_id="collector-1"
    )
    assert built.to_json() == text.encode()


def _bundled() -> records.AcceptedManifest:
    frame, _ = _frame_and_sha()
    offset = bv.ENTRIES[0][0]
    return records.AcceptedManifest.of_frame(
        frame,
        accepted_at_unix_ns=1_760_000_000_000_000_000,
        collector_id="collector-1",
        bundle=(keys.raw_bundle_key(bv.BUNDLE_SHA256), offset),
    )


def test_a_bundled_record_round_trips_for_a_reader_of_bundles() -> None:
    manifest = _bundled()
    body = manifest.to_json()
    fields = json.loads(body)
    assert fields["raw_blob_key"] == keys.raw_bundle_key(bv.BUNDLE_SHA256)
    assert (fields["raw_offset"], fields["raw_length"]) == (0, 1031)
    parsed = records.AcceptedManifest.from_json(body, reads_bundles=True)
    assert parsed == manifest and parsed.raw_range == (0, 1031)
    frame = bd.read_frame(
        bv.golden_bundle(),
        *parsed.raw_range,
        frame_sha256=parsed.frame_sha256,
        max_frame_bytes=1 << 20,
        identity=parsed.identity,
    )
    assert bytes(frame) == bv.golden_frames()[0]


def test_a_reader_that_does_not_read_bundles_refuses_the_range() -> None:
    with pytest.raises(records.RecordError, match="names a bundle"):
        records.AcceptedManifest.from_json(_bundled().to_json())


def test_ill_formed_ranges_are_refused() -> None:
    fields = json.loads(_bundled().to_json())
    cases: dict[str, dict[str, Any]] = {
        "given together": {"raw_length": None},
        "must name a bundle": {"raw_blob_key": keys.raw_blob_key(fields["frame_sha256"])},
        "raw_length 1030 != frame_bytes": {"raw_length": 1030},
        "greater than or equal to 0": {"raw_offset": -1},
        "greater than or equal to 56": {"raw_length": 55},
    }
    for message, change in cases.items():
        body = json.dumps({**fields, **change})
        with pytest.raises(records.RecordError, match=message):
            records.AcceptedManifest.from_json(body, reads_bundles=True)
    # A frame blob's record carrying a range of its own is not a well-formed form either.
    with pytest.raises(ValidationError, match="names a bundle"):
        records.AcceptedManifest(
            **{**fields, "raw_blob_key": keys.raw_blob_key(fields["frame_sha256"])}
        )
