"""JSON records: exact shapes, validation on read, and consistency checks."""

from __future__ import annotations

import hashlib
import json
import uuid

import pyarrow as pa
import pytest

from protocol import keys, records
from protocol.frame import POINTS_SCHEMA, FrameError
from protocol.frame_encode import encode_frame

SHA = "ab" * 32
BOOT = "5f0c7a3e-1d2b-4c3a-9e8f-0123456789ab"


def manifest(**overrides: object) -> records.AcceptedManifest:
    fields: dict[str, object] = {
        "agent_id": "agent-a",
        "boot_id": BOOT,
        "seq_start": 10,
        "seq_end": 20,
        "record_count": 11,
        "frame_sha256": SHA,
        "frame_bytes": 12345,
        "raw_blob_key": keys.raw_blob_key(SHA),
        "accepted_at_unix_ns": 1_760_000_000_000_000_000,
        "collector_id": "collector-1",
    }
    fields.update(overrides)
    return records.AcceptedManifest.model_validate(fields)


def test_accepted_manifest_has_exactly_the_protocol_fields() -> None:
    body = json.loads(manifest().to_json())
    assert list(body) == [
        "schema", "agent_id", "boot_id", "seq_start", "seq_end", "record_count", "frame_sha256",
        "frame_bytes", "raw_blob_key", "accepted_at_unix_ns", "collector_id", "wire_version",
        "frame_version",
    ]  # fmt: skip
    assert body["schema"] == "lightmetrics.accepted_batch.v1"
    assert body["wire_version"] == 1 and body["frame_version"] == 1


def test_round_trip_and_derived_properties() -> None:
    original = manifest()
    parsed = records.AcceptedManifest.from_json(original.to_json())
    assert parsed == original
    assert parsed.manifest_key == keys.accepted_manifest_key(parsed.identity)
    assert parsed.accepted_hour.iso == "2025-10-09T08"


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"record_count": 10}, "record_count 10 != seq_end - seq_start + 1 = 11"),
        ({"raw_blob_key": "raw-blobs/v1/x"}, "does not match frame_sha256"),
        ({"boot_id": BOOT.upper()}, "canonical"),
        ({"boot_id": "00000000-0000-0000-0000-000000000000"}, "all zero"),
        ({"frame_sha256": "AB" * 32}, "frame_sha256"),
        ({"seq_start": 21}, "seq_start <= seq_end"),
    ],
)
def test_inconsistent_manifest_is_refused(overrides: dict[str, object], problem: str) -> None:
    body = json.loads(manifest().to_json())
    body.update(overrides)
    with pytest.raises(records.RecordError, match="invalid AcceptedManifest") as info:
        records.AcceptedManifest.from_json(json.dumps(body))
    assert problem in str(info.value)


def test_wrong_schema_and_garbage_are_refused() -> None:
    body = json.loads(manifest().to_json())
    body["schema"] = "lightmetrics.accepted_batch.v2"
    with pytest.raises(records.RecordError, match="schema"):
        records.AcceptedManifest.from_json(json.dumps(body))
    with pytest.raises(records.RecordError):
        records.AcceptedManifest.from_json(b"\xff not json")


def test_unknown_fields_are_ignored_for_additive_evolution() -> None:
    body = json.loads(manifest().to_json())
    body["future_field"] = 1
    assert records.AcceptedManifest.from_json(json.dumps(body)) == manifest()


def test_identity_conflict_record() -> None:
    conflict = records.IdentityConflict(
        agent_id="agent-a", boot_id=BOOT, seq_start=10, seq_end=20,
        accepted_manifest_key=manifest().manifest_key, accepted_raw_blob_key=keys.raw_blob_key(SHA),
        accepted_frame_sha256=SHA, submitted_raw_blob_key=keys.raw_blob_key("cd" * 32),
        submitted_frame_sha256="cd" * 32, observed_at_unix_ns=5, collector_id="c2",
    )  # fmt: skip
    body = json.loads(conflict.to_json())
    assert body["schema"] == "lightmetrics.identity_conflict.v1"
    assert conflict.quarantine_key == keys.quarantine_key(conflict.identity, "cd" * 32)
    assert records.IdentityConflict.from_json(conflict.to_json()) == conflict
    # PROTOCOL §3.2: records written before ``accepted_blob_present`` read as true.
    assert body.pop("accepted_blob_present") is True
    assert records.IdentityConflict.from_json(json.dumps(body)) == conflict
    gone = conflict.model_copy(update={"accepted_blob_present": False})
    assert records.IdentityConflict.from_json(gone.to_json()).accepted_blob_present is False


def test_lease_record_is_exactly_the_protocol_shape() -> None:
    lease = records.LeaseRecord(owner="job-1", epoch=3, expires_at_unix_ns=99)
    assert json.loads(lease.to_json()) == {"owner": "job-1", "epoch": 3, "expires_at_unix_ns": 99}
    with pytest.raises(records.RecordError, match="epoch"):
        records.LeaseRecord.from_json(b'{"owner": "x", "epoch": 0, "expires_at_unix_ns": 1}')


def test_index_entry_kinds() -> None:
    entry = records.IndexEntry(
        kind="accepted-by-time",
        source_key="accepted/v1/x.json",
        frame_sha256=SHA,
        indexed_time_unix_ns=1,
    )
    assert records.IndexEntry.from_json(entry.to_json()) == entry
    with pytest.raises(records.RecordError, match="kind"):
        records.IndexEntry.from_json(entry.to_json().replace(b"accepted-by-time", b"by-nothing"))


def test_of_frame_is_the_manifest_a_collector_creates() -> None:
    boot = uuid.UUID("11111111-2222-4333-8444-555555555555")
    points = pa.Table.from_pylist(
        [{"ts": t, "metric": "m", "value": 1.0, "labels": []} for t in (1, 2, 3)],
        schema=POINTS_SCHEMA,
    )
    frame = encode_frame(agent_id="agent-x", boot_id=boot, seq_start=40, points=points)
    manifest = records.AcceptedManifest.of_frame(frame, accepted_at_unix_ns=7, collector_id="c")
    sha = hashlib.sha256(frame).hexdigest()
    assert manifest.identity == keys.BatchIdentity("agent-x", boot, 40, 42)
    assert (manifest.record_count, manifest.frame_sha256, manifest.frame_bytes) == (
        3,
        sha,
        len(frame),
    )
    assert manifest.raw_blob_key == keys.raw_blob_key(sha)
    assert (manifest.accepted_at_unix_ns, manifest.collector_id) == (7, "c")
    # A caller that decoded and hashed already passes both (nothing is recomputed).
    other = keys.BatchIdentity("agent-y", boot, 1, 3)
    given = records.AcceptedManifest.of_frame(
        frame, identity=other, frame_sha256="ab" * 32, accepted_at_unix_ns=7, collector_id="c"
    )
    assert (given.identity, given.frame_sha256) == (other, "ab" * 32)
    with pytest.raises(FrameError):
        records.AcceptedManifest.of_frame(b"not a frame", accepted_at_unix_ns=7, collector_id="c")
