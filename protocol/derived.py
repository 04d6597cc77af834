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

An entry's body names the record it indexes (``source_key``): the record's key, which is
the long form for a record written before PROTOCOL §3's segment rule (callers that read
the record from such a key pass it). An ``accepted-by-time`` key leads to its manifest
by itself only when it spells the agent and is in the form the rule gives (agent_ids up
to 82 bytes: `manifest_key_of_by_time_key`); for any other (``h-``, or the long form a
store written before the rule holds) the body names the manifest: `by_time_source`.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol import keys
from protocol.records import AcceptedManifest, IdentityConflict, IndexEntry, IndexKind, RecordError


@dataclass(frozen=True, slots=True)
class DerivedEntry:
    """One derived index entry: create ``body`` at ``key`` with If-None-Match."""

    kind: IndexKind
    key: str
    body: bytes
    hour: keys.UtcHour | None = None
    """The hour partition for the by-time kinds; ``None`` for the by-blob kinds."""


def accepted_entries(
    manifest: AcceptedManifest, manifest_key: str | None = None
) -> list[DerivedEntry]:
    """``accepted-by-time`` and ``accepted-by-blob`` of one accepted manifest, stored at
    ``manifest_key`` (default: its key under the segment rule)."""
    sha = manifest.frame_sha256
    source = manifest_key or manifest.manifest_key
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


def quarantine_entries(
    conflict: IdentityConflict, quarantine_key: str | None = None
) -> list[DerivedEntry]:
    """``quarantine-by-blob`` of one quarantine record (the submitted frame's blob), stored
    at ``quarantine_key`` (default: its key under the segment rule)."""
    sha = conflict.submitted_frame_sha256
    source = quarantine_key or conflict.quarantine_key
    return [
        DerivedEntry(
            "quarantine-by-blob",
            keys.quarantine_by_blob_key(sha, conflict.identity),
            _body("quarantine-by-blob", source, sha, conflict.observed_at_unix_ns),
        )
    ]


def manifest_backfill(
    manifest: AcceptedManifest, manifest_key: str | None = None
) -> list[DerivedEntry]:
    """Every derived entry the reconciler keeps for one accepted manifest."""
    return [
        *accepted_entries(manifest, manifest_key),
        raw_blob_by_time_entry(manifest.frame_sha256, manifest.accepted_at_unix_ns),
    ]


def quarantine_backfill(
    conflict: IdentityConflict, quarantine_key: str | None = None
) -> list[DerivedEntry]:
    """Every derived entry the reconciler keeps for one quarantine record."""
    return [
        *quarantine_entries(conflict, quarantine_key),
        raw_blob_by_time_entry(conflict.submitted_frame_sha256, conflict.observed_at_unix_ns),
    ]


def manifest_key_of_by_time_key(
    hour: keys.UtcHour, named: keys.KeyIdentity, entry_key: str
) -> str | None:
    """The accepted manifest key the ``accepted-by-time`` key ``entry_key`` (parsed into
    ``hour`` and ``named``) leads to by itself, or ``None``: read the entry's body and ask
    `by_time_source`."""
    identity = named.identity
    if identity is None or keys.accepted_by_time_key(hour, identity) != entry_key:
        return None
    return keys.accepted_manifest_key(identity)


def by_time_source(named: keys.KeyIdentity, entry_body: bytes) -> str:
    """The accepted manifest key an ``accepted-by-time`` entry names, from its body (see
    `manifest_key_of_by_time_key`). Raises `RecordError` when the body is unreadable or
    names a key of another batch."""
    entry = IndexEntry.from_json(entry_body)
    try:
        source = keys.parse_accepted_manifest_key(entry.source_key)
    except keys.KeyFormatError as exc:
        raise RecordError(f"accepted-by-time entry names {entry.source_key!r}: {exc}") from None
    if source != named:
        raise RecordError(f"accepted-by-time entry of {named} names {entry.source_key!r}")
    return entry.source_key


def _body(kind: IndexKind, source_key: str, sha: str, at_unix_ns: int) -> bytes:
    return IndexEntry(
        kind=kind, source_key=source_key, frame_sha256=sha, indexed_time_unix_ns=at_unix_ns
    ).to_json()
