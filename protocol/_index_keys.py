"""The index's keys (PROTOCOL §3.7): collector log segments, catalog files, their
``catalog-created`` entries and the rollup's work markers; the store's feature record and
version registry (PROTOCOL §3.10 "Writing"). Part of `protocol.keys`' API
(``keys.index_catalog_key``, ...)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from protocol._hours import UtcHour
from protocol._identity_keys import KeyFormatError

INDEX_LOG_PREFIX = "index/v1/log/"
INDEX_CATALOG_PREFIX = "index/v1/catalog/"
INDEX_UNREADABLE_PREFIX = "index/v1/unreadable/"
INDEX_CATALOG_CREATED_PREFIX = "index/v1/catalog-created/"
ROLLUP_WORK_PREFIX = "work/v1/rollup-dirty/catalog/"
INDEX_FEATURES_KEY = "index/v1/features.json"
INDEX_VERSIONS_PREFIX = "index/v1/versions/"
PROCESS_ROLES = (
    "collector",
    "query-collector",
    "reconciler",
    "rollup-job",
    "rollup-verify",
    "chaos",
)
"""The roles of ``index/v1/versions/<role>-<id>.json`` (PROTOCOL §3.10): every process that
parses records or raw objects. No role is another's prefix plus ``-``, so a key parses one
way only."""
_VERSION_ENTRY_RE = re.compile(
    rf"index/v1/versions/({'|'.join(PROCESS_ROLES)})-([A-Za-z0-9._-]{{1,128}})\.json"
)
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
    time_ns: int
    """The cut time (PROTOCOL §3.7); for a segment written before that rule, its oldest
    row's time. Readers order and position by it either way."""
    writer_id: str
    random: int


def index_log_segment_key(time_ns: int, writer_id: str, random64: int) -> str:
    """``index/v1/log/date=…/hour=HH/<cut-time-ns:020d>-<writer-id>-<random:016x>.parquet``:
    ``time_ns`` is the segment's cut time (the writer's clock when it cut the segment,
    PROTOCOL §3.7, never a row's record time) and the partition its hour, so listing order
    is cut-time order across hours. Segments written before that rule carry their oldest
    row's time in the same place and are read the same way."""
    if not _WRITER_ID_RE.fullmatch(writer_id):
        raise KeyFormatError(f"writer id must be 1..64 of [A-Za-z0-9._-], got {writer_id!r}")
    if not 0 <= random64 < 2**64 or time_ns < 0:
        raise KeyFormatError("segment time must be >= 0 and the random part 64 bits")
    hour = UtcHour.from_unix_ns(time_ns)
    return f"{INDEX_LOG_PREFIX}{hour.partition}/{time_ns:020d}-{writer_id}-{random64:016x}.parquet"


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
    """The StartAfter key that lists every segment whose name's time is >= ``time_ns``
    (and nothing older): segment names sort by cut time (PROTOCOL §3.7)."""
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


def version_entry_key(role: str, process_id: str) -> str:
    """``index/v1/versions/<role>-<id>.json``: one process's version entry (PROTOCOL
    §3.10). A collector's ``process_id`` is its `index_writer_id`, so a log writer and its
    entry are matched by name."""
    if role not in PROCESS_ROLES:
        raise KeyFormatError(f"process role must be one of {PROCESS_ROLES}, got {role!r}")
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,128}", process_id):
        raise KeyFormatError(f"process id must be 1..128 of [A-Za-z0-9._-], got {process_id!r}")
    return f"{INDEX_VERSIONS_PREFIX}{role}-{process_id}.json"


def parse_version_entry_key(key: str) -> tuple[str, str]:
    """``(role, process id)`` of a version entry key."""
    match = _VERSION_ENTRY_RE.fullmatch(key)
    if not match:
        raise KeyFormatError(f"not a version entry key: {key!r}")
    return match.group(1), match.group(2)
