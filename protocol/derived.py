"""The derived index entries of accepted manifests and quarantine records (PROTOCOL §3.2).

Pure: no I/O. The collector writes these entries after it creates a blob or a record; the
reconciler rebuilds them from ``accepted/v1/`` and ``quarantine/v1/``. Both take keys and
bodies from here, so the two writers can never disagree on a key. Every entry is created
with If-None-Match; a 412 means it is already there, which is success. Bodies are
`records.IndexEntry`; the key decides whether an entry exists, so two writers that choose
different ``indexed_time_unix_ns`` for one key (the collector's clock, the reconciler's
manifest time) are equivalent.

- `accepted_entries`: what the collector writes once it created a manifest
  (``accepted-by-time`` in the hour of ``accepted_at_unix_ns``, ``accepted-by-blob``).
- `raw_blob_by_time_entry`: what the collector writes once it created a raw blob, in the
  hour it created it.
- `quarantine_entries`: what the collector writes with a quarantine record
  (``quarantine-by-blob`` of the submitted frame).
- `manifest_backfill` / `quarantine_backfill`: everything the reconciler (re)creates for
  one record: the entries above plus the raw blob's ``raw-blobs-by-time`` entry in the
  record's own hour (PROTOCOL §3.2: the reconciler uses the referencing record's hour,
  since the blob's creation time is not recorded).
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol import keys
from protocol.records import AcceptedManifest, IdentityConflict, IndexEntry, IndexKind


@dataclass(frozen=True, slots=True)
class DerivedEntry:
    """One derived index entry: create ``body`` at ``key`` with If-None-Match."""

    kind: IndexKind
    key: str
    body: bytes
    hour: keys.UtcHour | None = None
    """The hour partition for the by-time kinds; ``None`` for the by-blob kinds."""


def accepted_entries(manifest: AcceptedManifest) -> list[DerivedEntry]:
    """``accepted-by-time`` and ``accepted-by-blob`` of one accepted manifest."""
    sha = manifest.frame_sha256
    source = manifest.manifest_key
    hour = manifest.accepted_hour
    return [
        DerivedEntry(
            "accepted-by-time",
            keys.accepted_by_time_key(hour, manifest.identity),
            _body("accepted-by-time", source, sha, manifest.accepted_at_unix_ns),
            hour,
        ),
        DerivedEntry(
            "accepted-by-blob",
            keys.accepted_by_blob_key(sha, manifest.identity),
            _body("accepted-by-blob", source, sha, manifest.accepted_at_unix_ns),
        ),
    ]


def raw_blob_by_time_entry(sha: str, at_unix_ns: int) -> DerivedEntry:
    """``raw-blobs-by-time`` of the blob ``sha``, in the UTC hour of ``at_unix_ns``."""
    hour = keys.UtcHour.from_unix_ns(at_unix_ns)
    return DerivedEntry(
        "raw-blobs-by-time",
        keys.raw_blob_by_time_key(hour, sha),
        _body("raw-blobs-by-time", keys.raw_blob_key(sha), sha, at_unix_ns),
        hour,
    )


def quarantine_entries(conflict: IdentityConflict) -> list[DerivedEntry]:
    """``quarantine-by-blob`` of one quarantine record (the submitted frame's blob)."""
    sha = conflict.submitted_frame_sha256
    return [
        DerivedEntry(
            "quarantine-by-blob",
            keys.quarantine_by_blob_key(sha, conflict.identity),
            _body("quarantine-by-blob", conflict.quarantine_key, sha, conflict.observed_at_unix_ns),
        )
    ]


def manifest_backfill(manifest: AcceptedManifest) -> list[DerivedEntry]:
    """Every derived entry the reconciler keeps for one accepted manifest."""
    return [
        *accepted_entries(manifest),
        raw_blob_by_time_entry(manifest.frame_sha256, manifest.accepted_at_unix_ns),
    ]


def quarantine_backfill(conflict: IdentityConflict) -> list[DerivedEntry]:
    """Every derived entry the reconciler keeps for one quarantine record."""
    return [
        *quarantine_entries(conflict),
        raw_blob_by_time_entry(conflict.submitted_frame_sha256, conflict.observed_at_unix_ns),
    ]


def _body(kind: IndexKind, source_key: str, sha: str, at_unix_ns: int) -> bytes:
    return IndexEntry(
        kind=kind, source_key=source_key, frame_sha256=sha, indexed_time_unix_ns=at_unix_ns
    ).to_json()
