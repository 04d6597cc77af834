"""Every object key of PROTOCOL §3-§4, built and parsed in exactly one place.

Encodings (PROTOCOL §3): ``agent-hex`` is the hex of the UTF-8 agent_id; ``boot-hex`` the
hex of the 16 boot_id bytes; sequence numbers are 20-digit zero-padded decimal; ``hh/hh``
are the first and second byte of the sha256 in hex; hours are UTC, written
``date=YYYY-MM-DD/hour=HH``. Builders validate their inputs; parsers raise `KeyFormatError`
naming the key and what is wrong with it.

Identities in keys, PROTOCOL §3's segment rule (``agent=h-<sha256>`` where an agent_id in
hex would make a segment longer than 255 bytes) and the `KeyIdentity` parsers return are
in ``_identity_keys.py``, hours (`UtcHour`) in ``_hours.py``, the rollup dataset's keys in
``_rollup_keys.py``, the index's (PROTOCOL §3.7) in ``_index_keys.py``, the raw objects'
(frame blobs and bundles, PROTOCOL §3.10) in ``_raw_keys.py``; the names imported ``as``
themselves below are part of this module's API (``keys.BatchIdentity``, ``keys.UtcHour``,
``keys.rollup_data_key``, ...).
"""

from __future__ import annotations

import hashlib
import re

from protocol._hours import NS_PER_S as NS_PER_S
from protocol._hours import UtcHour as UtcHour
from protocol._hours import hours_between as hours_between
from protocol._identity_keys import AGENT_DIGEST_MARK as AGENT_DIGEST_MARK
from protocol._identity_keys import (
    IDENTITY_RE,
    agent_segment,
    key_identity_from_groups,
)
from protocol._identity_keys import MAX_U64 as MAX_U64
from protocol._identity_keys import SEGMENT_MAX_BYTES as SEGMENT_MAX_BYTES
from protocol._identity_keys import BatchIdentity as BatchIdentity
from protocol._identity_keys import KeyFormatError as KeyFormatError
from protocol._identity_keys import KeyIdentity as KeyIdentity
from protocol._identity_keys import check_sha256 as check_sha256
from protocol._identity_keys import identity_matches_key as identity_matches_key
from protocol._identity_keys import identity_name as identity_name
from protocol._identity_keys import long_agent_segment as long_agent_segment
from protocol._identity_keys import parse_identity_name as parse_identity_name
from protocol._identity_keys import parse_manifest_id as parse_manifest_id
from protocol._index_keys import INDEX_CATALOG_CREATED_PREFIX as INDEX_CATALOG_CREATED_PREFIX
from protocol._index_keys import INDEX_CATALOG_PREFIX as INDEX_CATALOG_PREFIX
from protocol._index_keys import INDEX_FEATURES_KEY as INDEX_FEATURES_KEY
from protocol._index_keys import INDEX_LOG_PREFIX as INDEX_LOG_PREFIX
from protocol._index_keys import INDEX_UNREADABLE_PREFIX as INDEX_UNREADABLE_PREFIX
from protocol._index_keys import INDEX_VERSIONS_PREFIX as INDEX_VERSIONS_PREFIX
from protocol._index_keys import PROCESS_ROLES as PROCESS_ROLES
from protocol._index_keys import ROLLUP_WORK_PREFIX as ROLLUP_WORK_PREFIX
from protocol._index_keys import LogSegmentName as LogSegmentName
from protocol._index_keys import catalog_created_key as catalog_created_key
from protocol._index_keys import index_catalog_hour_prefix as index_catalog_hour_prefix
from protocol._index_keys import index_catalog_key as index_catalog_key
from protocol._index_keys import index_log_segment_key as index_log_segment_key
from protocol._index_keys import index_log_start_after as index_log_start_after
from protocol._index_keys import index_writer_id as index_writer_id
from protocol._index_keys import parse_catalog_created_key as parse_catalog_created_key
from protocol._index_keys import parse_index_catalog_key as parse_index_catalog_key
from protocol._index_keys import parse_index_log_segment_key as parse_index_log_segment_key
from protocol._index_keys import parse_rollup_work_marker_key as parse_rollup_work_marker_key
from protocol._index_keys import parse_version_entry_key as parse_version_entry_key
from protocol._index_keys import rollup_work_marker_key as rollup_work_marker_key
from protocol._index_keys import version_entry_key as version_entry_key
from protocol._raw_keys import RAW_BLOB_SUFFIX as RAW_BLOB_SUFFIX
from protocol._raw_keys import RAW_BLOBS_PREFIX as RAW_BLOBS_PREFIX
from protocol._raw_keys import RAW_BUNDLE_SUFFIX as RAW_BUNDLE_SUFFIX
from protocol._raw_keys import RAW_BUNDLES_PREFIX as RAW_BUNDLES_PREFIX
from protocol._raw_keys import RawKind as RawKind
from protocol._raw_keys import parse_raw_blob_key as parse_raw_blob_key
from protocol._raw_keys import parse_raw_bundle_key as parse_raw_bundle_key
from protocol._raw_keys import parse_raw_object_key as parse_raw_object_key
from protocol._raw_keys import raw_blob_key as raw_blob_key
from protocol._raw_keys import raw_bundle_key as raw_bundle_key
from protocol._rollup_keys import ROLLUP_ICEBERG_PREFIX as ROLLUP_ICEBERG_PREFIX
from protocol._rollup_keys import ROLLUP_LEDGER_PREFIX as ROLLUP_LEDGER_PREFIX
from protocol._rollup_keys import ROLLUP_MANIFESTS_PREFIX as ROLLUP_MANIFESTS_PREFIX
from protocol._rollup_keys import ROLLUP_OWNER_KEY as ROLLUP_OWNER_KEY
from protocol._rollup_keys import ROLLUP_POINTER_KEY as ROLLUP_POINTER_KEY
from protocol._rollup_keys import ROLLUP_PREFIX as ROLLUP_PREFIX
from protocol._rollup_keys import ROLLUP_READERS_PREFIX as ROLLUP_READERS_PREFIX
from protocol._rollup_keys import ROLLUP_TABLES_PREFIX as ROLLUP_TABLES_PREFIX
from protocol._rollup_keys import ROLLUP_TOMBSTONES_PREFIX as ROLLUP_TOMBSTONES_PREFIX
from protocol._rollup_keys import TOMBSTONE_ID_PATTERN as TOMBSTONE_ID_PATTERN
from protocol._rollup_keys import rollup_data_key as rollup_data_key
from protocol._rollup_keys import rollup_iceberg_file_key as rollup_iceberg_file_key
from protocol._rollup_keys import rollup_iceberg_metadata_key as rollup_iceberg_metadata_key
from protocol._rollup_keys import rollup_iceberg_version_hint_key as rollup_iceberg_version_hint_key
from protocol._rollup_keys import rollup_ledger_key as rollup_ledger_key
from protocol._rollup_keys import rollup_manifest_key as rollup_manifest_key
from protocol._rollup_keys import rollup_reader_key as rollup_reader_key
from protocol._rollup_keys import rollup_tombstone_key as rollup_tombstone_key

RAW_BLOBS_BY_TIME_PREFIX = "raw-blobs-by-time/v1/"
ACCEPTED_PREFIX = "accepted/v1/"
ACCEPTED_BY_TIME_PREFIX = "accepted-by-time/v1/"
ACCEPTED_BY_BLOB_PREFIX = "accepted-by-blob/v1/sha256/"
QUARANTINE_PREFIX = "quarantine/v1/identity-conflict/"
QUARANTINE_BY_BLOB_PREFIX = "quarantine-by-blob/v1/sha256/"
GC_MARKS_PREFIX = "gc/v1/marks/"
GC_VETOES_PREFIX = "gc/v1/vetoes/"
GC_LOG_PREFIX = "gc/v1/log/"
RAW_RETENTION_KEY = "gc/v1/raw-retention.json"
"""How far raw retention has retired accepted hours (`records.RawRetention`)."""
RECONCILER_PREFIX = "reconciler/v1/"
ROLLUP_DIRTY_PREFIX = "work/v1/rollup-dirty/"
PROBE_PREFIX = "probe/v1/"


def _sha_dirs(sha: str) -> str:
    check_sha256(sha)
    return f"{sha[0:2]}/{sha[2:4]}/{sha}"


# --- raw blobs (the raw object keys are in _raw_keys.py) ------------------------------


def raw_blob_by_time_key(hour: UtcHour, sha: str) -> str:
    return f"{RAW_BLOBS_BY_TIME_PREFIX}{hour.partition}/sha256={check_sha256(sha)}.json"


def parse_raw_blob_by_time_key(key: str) -> tuple[UtcHour, str]:
    pattern = (
        r"raw-blobs-by-time/v1/(date=\d{4}-\d{2}-\d{2}/hour=\d{2})/sha256=([0-9a-f]{64})\.json"
    )
    match = re.fullmatch(pattern, key)
    if not match:
        raise KeyFormatError(f"not a raw-blobs-by-time key: {key!r}")
    return UtcHour.parse_partition(match.group(1)), match.group(2)


# --- accepted manifests and their indexes ------------------------------------------------


def accepted_manifest_key(identity: BatchIdentity) -> str:
    return f"{ACCEPTED_PREFIX}{identity.path}.json"


def legacy_accepted_manifest_key(identity: BatchIdentity) -> str | None:
    """The long-form key a store written before the segment rule may hold this batch's
    manifest at, where `accepted_manifest_key` uses ``h-``; else ``None``. A collector
    creating the ``h-`` key reads this first (found: as a 412), so no batch is accepted
    twice (PROTOCOL §3)."""
    legacy = identity.legacy_path
    return f"{ACCEPTED_PREFIX}{legacy}.json" if legacy is not None else None


def parse_accepted_manifest_key(key: str) -> KeyIdentity:
    match = re.fullmatch(rf"accepted/v1/{IDENTITY_RE}\.json", key)
    if not match:
        raise KeyFormatError(f"not an accepted-manifest key: {key!r}")
    return key_identity_from_groups(match.groups(), key)


def accepted_by_time_key(hour: UtcHour, identity: BatchIdentity) -> str:
    return f"{ACCEPTED_BY_TIME_PREFIX}{hour.partition}/{identity_name(identity, '.json')}"


def accepted_by_blob_key(sha: str, identity: BatchIdentity) -> str:
    return f"{ACCEPTED_BY_BLOB_PREFIX}{_sha_dirs(sha)}/{identity.path}.json"


def accepted_by_blob_prefix(sha: str) -> str:
    """Every accepted-by-blob entry for one blob lies under this prefix."""
    return f"{ACCEPTED_BY_BLOB_PREFIX}{_sha_dirs(sha)}/"


def parse_accepted_by_blob_key(key: str) -> tuple[str, KeyIdentity]:
    match = re.fullmatch(
        rf"accepted-by-blob/v1/sha256/([0-9a-f]{{2}})/([0-9a-f]{{2}})/([0-9a-f]{{64}})/{IDENTITY_RE}\.json",
        key,
    )
    if not match or match.group(3)[:4] != match.group(1) + match.group(2):
        raise KeyFormatError(f"not an accepted-by-blob key: {key!r}")
    return match.group(3), key_identity_from_groups(match.groups()[3:], key)


# --- quarantine ----------------------------------------------------------------------------


def quarantine_key(identity: BatchIdentity, sha: str) -> str:
    return f"{QUARANTINE_PREFIX}{identity.path}/{check_sha256(sha)}.json"


def legacy_quarantine_key(identity: BatchIdentity, sha: str) -> str | None:
    """As `legacy_accepted_manifest_key`, for a quarantine record."""
    legacy = identity.legacy_path
    return f"{QUARANTINE_PREFIX}{legacy}/{check_sha256(sha)}.json" if legacy is not None else None


def quarantine_identity_prefixes(identity: BatchIdentity) -> list[str]:
    """The prefixes holding one batch identity's quarantine records, one per agent key
    form (its key's form, then the long form where that is ``h-``): what the GC's
    targeted proof lists (PROTOCOL §3.5 rule 7)."""
    paths = [identity.path] + ([identity.legacy_path] if identity.legacy_path else [])
    return [f"{QUARANTINE_PREFIX}{path}/" for path in dict.fromkeys(paths)]


def quarantine_boot_prefixes(identity: BatchIdentity) -> list[str]:
    """The prefixes holding the quarantine records of every batch of one agent/boot pair,
    one per agent key form (as `quarantine_identity_prefixes`, without the seq range):
    one LIST of each serves all of a bundle's frames of that boot (PROTOCOL §3.10)."""
    return [p.rsplit("/", 2)[0] + "/" for p in quarantine_identity_prefixes(identity)]


def quarantine_agent_prefixes(agent_id: str) -> list[str]:
    """The prefixes holding one agent's quarantine records: its key's form, then the long
    form where that is ``h-`` (written before the segment rule)."""
    current, long_form = agent_segment(agent_id, 0), long_agent_segment(agent_id)
    return [f"{QUARANTINE_PREFIX}{s}/" for s in dict.fromkeys([current, long_form])]


def parse_quarantine_key(key: str) -> tuple[KeyIdentity, str]:
    match = re.fullmatch(
        rf"quarantine/v1/identity-conflict/{IDENTITY_RE}/([0-9a-f]{{64}})\.json", key
    )
    if not match:
        raise KeyFormatError(f"not a quarantine key: {key!r}")
    return key_identity_from_groups(match.groups()[:4], key), match.group(5)


def quarantine_by_blob_key(sha: str, identity: BatchIdentity) -> str:
    return f"{QUARANTINE_BY_BLOB_PREFIX}{_sha_dirs(sha)}/{identity.path}.json"


def quarantine_by_blob_prefix(sha: str) -> str:
    return f"{QUARANTINE_BY_BLOB_PREFIX}{_sha_dirs(sha)}/"


# --- garbage collection ------------------------------------------------------------------


def gc_mark_key(sha: str) -> str:
    return f"{GC_MARKS_PREFIX}{check_sha256(sha)}.json"


def gc_veto_key(sha: str) -> str:
    return f"{GC_VETOES_PREFIX}{check_sha256(sha)}.json"


def parse_gc_mark_key(key: str) -> str:
    """Return the sha256 named by a GC mark key."""
    match = re.fullmatch(r"gc/v1/marks/([0-9a-f]{64})\.json", key)
    if not match:
        raise KeyFormatError(f"not a GC mark key: {key!r}")
    return match.group(1)


def parse_gc_veto_key(key: str) -> str:
    """Return the sha256 named by a GC veto key."""
    match = re.fullmatch(r"gc/v1/vetoes/([0-9a-f]{64})\.json", key)
    if not match:
        raise KeyFormatError(f"not a GC veto key: {key!r}")
    return match.group(1)


def gc_log_key(run_started_at_unix_ns: int, epoch: int) -> str:
    """``gc/v1/log/date=…/hour=HH/<run-start-ns:020d>-<epoch>.parquet``: one file per GC
    run (PROTOCOL §3.5), in the hour the run started."""
    if run_started_at_unix_ns < 0 or epoch < 0:
        raise KeyFormatError("GC run start and epoch must be >= 0")
    hour = UtcHour.from_unix_ns(run_started_at_unix_ns)
    return f"{GC_LOG_PREFIX}{hour.partition}/{run_started_at_unix_ns:020d}-{epoch}.parquet"


# --- reconciler ------------------------------------------------------------------------

RECONCILER_LEASE_KEY = f"{RECONCILER_PREFIX}lease.json"
RECONCILER_INDEX_CHECKPOINT_KEY = f"{RECONCILER_PREFIX}index-checkpoint.json"
RECONCILER_AUDITS_PREFIX = f"{RECONCILER_PREFIX}audits/"
RECONCILER_PROBLEMS_PREFIX = f"{RECONCILER_PREFIX}problems/"
RECONCILER_GC_RUNS_PREFIX = f"{RECONCILER_PREFIX}gc-runs/"
RECONCILER_AUDIT_ORPHANS_PREFIX = f"{RECONCILER_PREFIX}audit-orphans/"
RECONCILER_RETRACTIONS_PREFIX = f"{RECONCILER_PREFIX}retractions/"
PROBLEM_KINDS = (
    "missing-blob",
    "corrupt-blob",
    "unparseable-manifest",
    "unparseable-quarantine",
    "gc-guard",
    "unreadable-gc-mark",
    "unreadable-index-file",
    "raw-retention-mismatch",
    "malformed-log-row",
    "catalog-mismatch",
    "phantom-row",
    "identity-mismatch",
    "overlapping-identity",
    "bad-range",
)


def audit_key(started_at_unix_ns: int, audit_id: str) -> str:
    """Audits sort by start time: the newest is the last key under the prefix."""
    if not re.fullmatch(r"[0-9a-f]{8,32}", audit_id):
        raise KeyFormatError(f"audit_id must be 8..32 hex digits, got {audit_id!r}")
    return f"{RECONCILER_AUDITS_PREFIX}{started_at_unix_ns:020d}-{audit_id}.json"


def audit_folder(started_at_unix_ns: int, audit_id: str) -> str:
    """The folder of one audit's working files, named like its record without ``.json``
    (``reconciler/v1/audits/<start:020d>-<audit-id>/``): it sorts right after its record
    (``.`` < ``/``), and deleting an audit deletes both (`audit_records.trim_old_audits`)."""
    return audit_key(started_at_unix_ns, audit_id).removesuffix(".json") + "/"


def audit_listing_prefix(started_at_unix_ns: int, audit_id: str) -> str:
    """Where one audit's ranged listing (its plan and Parquet parts) lives: PROTOCOL §3.9's
    ``reconciler/v1/audits/<audit-id>/listing/``, with the record's name stem
    ``<start:020d>-<audit-id>`` as ``<audit-id>`` so the folder sorts with its record."""
    return f"{audit_folder(started_at_unix_ns, audit_id)}listing/"


def audit_orphans_key(started_at_unix_ns: int, audit_id: str) -> str:
    """The orphan blobs a completed audit's listing found (Parquet), named like its audit."""
    name = audit_key(started_at_unix_ns, audit_id).removeprefix(RECONCILER_AUDITS_PREFIX)
    return f"{RECONCILER_AUDIT_ORPHANS_PREFIX}{name.removesuffix('.json')}.parquet"


def problem_key(kind: str, subject_key: str) -> str:
    """One record per (kind, subject); the subject is the object key the problem is about."""
    if kind not in PROBLEM_KINDS:
        raise KeyFormatError(f"problem kind must be one of {PROBLEM_KINDS}, got {kind!r}")
    digest = hashlib.sha256(subject_key.encode("utf-8")).hexdigest()
    return f"{RECONCILER_PROBLEMS_PREFIX}{kind}/{digest}.json"


def retraction_key(record_key: str) -> str:
    """An operator's retraction of the catalog row of ``record_key`` (a phantom row,
    PROTOCOL §3.7): one per record key, named by the SHA-256 of the key."""
    digest = hashlib.sha256(record_key.encode("utf-8")).hexdigest()
    return f"{RECONCILER_RETRACTIONS_PREFIX}{digest}.json"


def gc_run_key(started_at_unix_ns: int, run_id: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{8,32}", run_id):
        raise KeyFormatError(f"gc run_id must be 8..32 hex digits, got {run_id!r}")
    return f"{RECONCILER_GC_RUNS_PREFIX}{started_at_unix_ns:020d}-{run_id}.json"


# --- work markers, probe, rollup --------------------------------------------------------


def rollup_dirty_key(hour: UtcHour) -> str:
    """A version-1 rollup dirty marker (one per hour; replaced by the work markers of the
    index, `rollup_work_marker_key`)."""
    return f"{ROLLUP_DIRTY_PREFIX}{hour.partition}.json"


def probe_key(token: str) -> str:
    """A unique key for the conditional-write probe (PROTOCOL §3.6)."""
    if not re.fullmatch(r"[0-9A-Za-z._-]{1,128}", token):
        raise KeyFormatError(f"probe token must be 1..128 of [0-9A-Za-z._-], got {token!r}")
    return f"{PROBE_PREFIX}{token}.json"


# --- version 1 before the index (PROTOCOL §3, §3.7) ----------------------------------------
# Stores written before the index hold per-object derived entries, a steady checkpoint of
# their own and one dirty marker per hour. The first completed audit of the index migrates
# such a store (it catalogs every record); after that nothing reads these, and
# ``lm-reconciler drop-v1-index`` deletes them.

V1_INDEX_PREFIXES = (
    "accepted-by-time/v1/",
    "accepted-by-blob/v1/",
    "raw-blobs-by-time/v1/",
    "quarantine-by-blob/v1/",
)
RECONCILER_V1_CHECKPOINT_KEY = f"{RECONCILER_PREFIX}checkpoint.json"
_V1_ROLLUP_DIRTY_RE = re.compile(r"work/v1/rollup-dirty/date=\d{4}-\d{2}-\d{2}/hour=\d{2}\.json")


def is_v1_rollup_dirty_key(key: str) -> bool:
    """Whether ``key`` is a version-1 hour dirty marker (`rollup_dirty_key`), not a work
    marker of the index (those live under `ROLLUP_WORK_PREFIX`)."""
    return _V1_ROLLUP_DIRTY_RE.fullmatch(key) is not None
