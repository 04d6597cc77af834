"""Every object key of PROTOCOL §3-§4, built and parsed in exactly one place.

Encodings (PROTOCOL §3): ``agent-hex`` is the hex of the UTF-8 agent_id; ``boot-hex`` the
hex of the 16 boot_id bytes; sequence numbers are 20-digit zero-padded decimal; ``hh/hh``
are the first and second byte of the sha256 in hex; hours are UTC, written
``date=YYYY-MM-DD/hour=HH``. Builders validate their inputs; parsers raise `KeyFormatError`
naming the key and what is wrong with it.

Identities in keys, PROTOCOL §3's segment rule (``agent=h-<sha256>`` where an agent_id in
hex would make a segment longer than 255 bytes) and the `KeyIdentity` parsers return are
in ``_identity_keys.py``; the names imported ``as`` themselves below are part of this
module's API (``keys.BatchIdentity``, ``keys.KeyFormatError``, ...).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, date, datetime

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

NS_PER_S = 1_000_000_000

RAW_BLOBS_PREFIX = "raw-blobs/v1/sha256/"
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
ROLLUP_PREFIX = "rollup/v1/"
PROBE_PREFIX = "probe/v1/"

_HOUR_RE = r"date=(\d{4}-\d{2}-\d{2})/hour=(\d{2})"


@dataclass(frozen=True, slots=True, order=True)
class UtcHour:
    """One UTC hour: the partition unit of every by-time index and rollup table."""

    day: date
    hour: int

    def __post_init__(self) -> None:
        if not 0 <= self.hour <= 23:
            raise KeyFormatError(f"hour must be 0..23, got {self.hour}")

    @classmethod
    def from_unix_ns(cls, unix_ns: int) -> UtcHour:
        moment = datetime.fromtimestamp(unix_ns // NS_PER_S, tz=UTC)
        return cls(moment.date(), moment.hour)

    @classmethod
    def parse_partition(cls, text: str) -> UtcHour:
        """Parse ``date=YYYY-MM-DD/hour=HH``."""
        match = re.fullmatch(_HOUR_RE, text)
        if not match:
            raise KeyFormatError(f"not a date=YYYY-MM-DD/hour=HH partition: {text!r}")
        return cls._from_parts(match.group(1), match.group(2), text)

    @classmethod
    def parse_iso(cls, text: str) -> UtcHour:
        """Parse the ledger's ``YYYY-MM-DDTHH``."""
        match = re.fullmatch(r"(\d{4}-\d{2}-\d{2})T(\d{2})", text)
        if not match:
            raise KeyFormatError(f"not a YYYY-MM-DDTHH hour: {text!r}")
        return cls._from_parts(match.group(1), match.group(2), text)

    @classmethod
    def _from_parts(cls, day_text: str, hour_text: str, whole: str) -> UtcHour:
        try:
            day = date.fromisoformat(day_text)
        except ValueError as exc:
            raise KeyFormatError(f"bad date in {whole!r}: {exc}") from None
        return cls(day, int(hour_text))

    @property
    def partition(self) -> str:
        return f"date={self.day.isoformat()}/hour={self.hour:02d}"

    @property
    def iso(self) -> str:
        return f"{self.day.isoformat()}T{self.hour:02d}"

    @property
    def start_ns(self) -> int:
        start = datetime(self.day.year, self.day.month, self.day.day, self.hour, tzinfo=UTC)
        return int(start.timestamp()) * NS_PER_S

    def next(self) -> UtcHour:
        return UtcHour.from_unix_ns(self.start_ns + 3600 * NS_PER_S)

    def shifted(self, hours: int) -> UtcHour:
        return UtcHour.from_unix_ns(self.start_ns + hours * 3600 * NS_PER_S)

    def __str__(self) -> str:
        return self.iso


def _sha_dirs(sha: str) -> str:
    check_sha256(sha)
    return f"{sha[0:2]}/{sha[2:4]}/{sha}"


# --- raw blobs ---------------------------------------------------------------------------


def raw_blob_key(sha: str) -> str:
    return f"{RAW_BLOBS_PREFIX}{sha[0:2]}/{sha[2:4]}/{check_sha256(sha)}.lmbatch"


def parse_raw_blob_key(key: str) -> str:
    """Return the sha256 named by a raw-blob key."""
    match = re.fullmatch(
        r"raw-blobs/v1/sha256/([0-9a-f]{2})/([0-9a-f]{2})/([0-9a-f]{64})\.lmbatch", key
    )
    if not match or match.group(3)[:4] != match.group(1) + match.group(2):
        raise KeyFormatError(f"not a raw-blob key: {key!r}")
    return match.group(3)


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


ROLLUP_POINTER_KEY = f"{ROLLUP_PREFIX}_latest_manifest"
ROLLUP_OWNER_KEY = f"{ROLLUP_PREFIX}owner.json"
ROLLUP_MANIFESTS_PREFIX = f"{ROLLUP_PREFIX}manifests/"
ROLLUP_TABLES_PREFIX = f"{ROLLUP_PREFIX}tables/"
ROLLUP_LEDGER_PREFIX = f"{ROLLUP_PREFIX}ledger/"
ROLLUP_READERS_PREFIX = f"{ROLLUP_PREFIX}readers/"


def rollup_manifest_key(version: int, commit_id: str) -> str:
    if version < 1:
        raise KeyFormatError(f"rollup version must be >= 1, got {version}")
    return f"{ROLLUP_MANIFESTS_PREFIX}v{version:020d}-{commit_id}.json"


def rollup_reader_key(reader_id: str) -> str:
    """A reader lease pinning one snapshot for a long read (PROTOCOL §4.1, readers and
    vacuum): ``rollup/v1/readers/<id>.json``."""
    if not re.fullmatch(r"[0-9A-Za-z._-]{1,128}", reader_id) or reader_id.startswith("."):
        raise KeyFormatError(f"reader id must be 1..128 of [0-9A-Za-z._-], got {reader_id!r}")
    return f"{ROLLUP_READERS_PREFIX}{reader_id}.json"


def rollup_data_key(table: str, hour: UtcHour, file_id: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", table):
        raise KeyFormatError(f"table name must be [a-z][a-z0-9_]*, got {table!r}")
    return f"{ROLLUP_TABLES_PREFIX}{table}/{hour.partition}/{file_id}.parquet"


def rollup_ledger_key(hour: UtcHour, file_id: str) -> str:
    return f"{ROLLUP_LEDGER_PREFIX}{hour.partition}/{file_id}.parquet"


ROLLUP_TOMBSTONES_PREFIX = f"{ROLLUP_PREFIX}tombstones/"
TOMBSTONE_ID_PATTERN = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def rollup_tombstone_key(tombstone_id: str) -> str:
    """A delete request's record (PROTOCOL §4.1): ``rollup/v1/tombstones/<uuid>.json``."""
    if not TOMBSTONE_ID_PATTERN.fullmatch(tombstone_id):
        raise KeyFormatError(f"tombstone id must be a lowercase uuid, got {tombstone_id!r}")
    return f"{ROLLUP_TOMBSTONES_PREFIX}{tombstone_id}.json"


ROLLUP_ICEBERG_PREFIX = f"{ROLLUP_PREFIX}iceberg/"


def rollup_iceberg_file_key(table: str, name: str) -> str:
    """A file of ``table``'s published Iceberg metadata (PROTOCOL §4.1): Hadoop-table
    layout, ``rollup/v1/iceberg/<table>/metadata/<name>``."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", table):
        raise KeyFormatError(f"table name must be [a-z][a-z0-9_]*, got {table!r}")
    if not re.fullmatch(r"[0-9A-Za-z._-]{1,128}", name):
        raise KeyFormatError(f"iceberg file name must be 1..128 of [0-9A-Za-z._-], got {name!r}")
    return f"{ROLLUP_ICEBERG_PREFIX}{table}/metadata/{name}"


def rollup_iceberg_metadata_key(table: str, version: int) -> str:
    """The Iceberg metadata of ``table`` at rollup ``version`` (``v<N>.metadata.json``,
    unpadded, as engines reading ``version-hint.text`` expect)."""
    if version < 1:
        raise KeyFormatError(f"rollup version must be >= 1, got {version}")
    return rollup_iceberg_file_key(table, f"v{version}.metadata.json")


def rollup_iceberg_version_hint_key(table: str) -> str:
    """The newest published version of ``table`` (text, the number alone)."""
    return rollup_iceberg_file_key(table, "version-hint.text")


def hours_between(first: UtcHour, last: UtcHour) -> list[UtcHour]:
    """Every hour from ``first`` to ``last`` inclusive (empty when last < first)."""
    hours: list[UtcHour] = []
    current = first
    while current <= last:
        hours.append(current)
        current = current.next()
    return hours


# --- the index (PROTOCOL §3.7) ------------------------------------------------------------

INDEX_LOG_PREFIX = "index/v1/log/"
INDEX_CATALOG_PREFIX = "index/v1/catalog/"
INDEX_UNREADABLE_PREFIX = "index/v1/unreadable/"
INDEX_CATALOG_CREATED_PREFIX = "index/v1/catalog-created/"
ROLLUP_WORK_PREFIX = "work/v1/rollup-dirty/catalog/"
_WRITER_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_LOG_SEGMENT_RE = re.compile(
    r"index/v1/log/(date=\d{4}-\d{2}-\d{2}/hour=\d{2})/(\d{20})-([A-Za-z0-9._-]{1,64})-([0-9a-f]{16})\.parquet"
)
_CATALOG_FILE_RE = re.compile(
    r"index/v1/catalog/(date=\d{4}-\d{2}-\d{2}/hour=\d{2})/(\d{10})-(\d{10})\.parquet"
)
_WORK_MARKER_RE = re.compile(
    r"work/v1/rollup-dirty/catalog/(date=\d{4}-\d{2}-\d{2}/hour=\d{2})/(\d{10})-(\d{10})\.json"
)


def index_writer_id(collector_id: str) -> str:
    """The ``<writer-id>`` of a log segment name for a collector: its id with every
    character outside ``[A-Za-z0-9._-]`` replaced by ``_``, at most 64 characters. Names
    stay unique without it being unique: each segment name ends in 64 random bits."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", collector_id)[:64] or "_"


@dataclass(frozen=True, slots=True)
class LogSegmentName:
    hour: UtcHour
    first_time_ns: int
    writer_id: str
    random: int


def index_log_segment_key(first_time_ns: int, writer_id: str, random64: int) -> str:
    """``index/v1/log/date=…/hour=HH/<first-time-ns:020d>-<writer-id>-<random:016x>.parquet``:
    the partition is the hour of ``first_time_ns`` (the segment's oldest row), so listing
    order is first-time order across hours."""
    if not _WRITER_ID_RE.fullmatch(writer_id):
        raise KeyFormatError(f"writer id must be 1..64 of [A-Za-z0-9._-], got {writer_id!r}")
    if not 0 <= random64 < 2**64 or first_time_ns < 0:
        raise KeyFormatError("segment time must be >= 0 and the random part 64 bits")
    hour = UtcHour.from_unix_ns(first_time_ns)
    return f"{INDEX_LOG_PREFIX}{hour.partition}/{first_time_ns:020d}-{writer_id}-{random64:016x}.parquet"


def parse_index_log_segment_key(key: str) -> LogSegmentName:
    match = _LOG_SEGMENT_RE.fullmatch(key)
    if not match:
        raise KeyFormatError(f"not an index log segment key: {key!r}")
    hour = UtcHour.parse_partition(match.group(1))
    first = int(match.group(2))
    if UtcHour.from_unix_ns(first) != hour:
        raise KeyFormatError(f"segment time is outside its hour partition: {key!r}")
    return LogSegmentName(hour, first, match.group(3), int(match.group(4), 16))


def index_log_start_after(time_ns: int) -> str:
    """The StartAfter key that lists every segment whose first time is >= ``time_ns``
    (and nothing older): segment names sort by first time (PROTOCOL §3.7)."""
    if time_ns <= 0:
        return INDEX_LOG_PREFIX
    hour = UtcHour.from_unix_ns(time_ns)
    return f"{INDEX_LOG_PREFIX}{hour.partition}/{time_ns - 1:020d}~"


def index_catalog_hour_prefix(hour: UtcHour) -> str:
    return f"{INDEX_CATALOG_PREFIX}{hour.partition}/"


def index_catalog_key(hour: UtcHour, epoch: int, sequence: int) -> str:
    """``index/v1/catalog/date=…/hour=HH/<epoch:010d>-<sequence:010d>.parquet``."""
    if not (0 <= epoch < 10**10 and 0 <= sequence < 10**10):
        raise KeyFormatError(
            f"catalog epoch and sequence must be 0..10^10-1, got {epoch}, {sequence}"
        )
    return f"{index_catalog_hour_prefix(hour)}{epoch:010d}-{sequence:010d}.parquet"


def parse_index_catalog_key(key: str) -> tuple[UtcHour, int, int]:
    """``(hour, epoch, sequence)`` of a catalog file key."""
    match = _CATALOG_FILE_RE.fullmatch(key)
    if not match:
        raise KeyFormatError(f"not an index catalog key: {key!r}")
    return UtcHour.parse_partition(match.group(1)), int(match.group(2)), int(match.group(3))


def catalog_created_key(epoch: int, sequence: int) -> str:
    """``index/v1/catalog-created/<epoch:010d>-<sequence:010d>``: the entry naming the
    catalog file of that epoch and sequence (PROTOCOL §3.7). Entries sort in creation
    order: a writer's sequence only grows within its epoch, and epochs only grow."""
    if not (0 <= epoch < 10**10 and 0 <= sequence < 10**10):
        raise KeyFormatError(
            f"catalog epoch and sequence must be 0..10^10-1, got {epoch}, {sequence}"
        )
    return f"{INDEX_CATALOG_CREATED_PREFIX}{epoch:010d}-{sequence:010d}"


def parse_catalog_created_key(key: str) -> tuple[int, int]:
    """``(epoch, sequence)`` of a catalog-created entry key."""
    match = re.fullmatch(r"index/v1/catalog-created/(\d{10})-(\d{10})", key)
    if not match:
        raise KeyFormatError(f"not a catalog-created key: {key!r}")
    return int(match.group(1)), int(match.group(2))


def rollup_work_marker_key(catalog_key: str) -> str:
    """The rollup's work marker for one catalog file (PROTOCOL §3.7): same hour and name."""
    hour, epoch, sequence = parse_index_catalog_key(catalog_key)
    return f"{ROLLUP_WORK_PREFIX}{hour.partition}/{epoch:010d}-{sequence:010d}.json"


def parse_rollup_work_marker_key(key: str) -> str:
    """The catalog file key a work marker names."""
    match = _WORK_MARKER_RE.fullmatch(key)
    if not match:
        raise KeyFormatError(f"not a rollup work marker key: {key!r}")
    return f"{INDEX_CATALOG_PREFIX}{match.group(1)}/{match.group(2)}-{match.group(3)}.parquet"


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
