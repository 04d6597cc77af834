"""The rollup dataset's keys (PROTOCOL §4, §4.1): the pointer, the owner lease, snapshots,
data and ledger files, reader leases, tombstones and the published Iceberg metadata.
Part of `protocol.keys`' API (``keys.rollup_data_key``, ...)."""

from __future__ import annotations

import re

from protocol._hours import UtcHour
from protocol._identity_keys import KeyFormatError

ROLLUP_PREFIX = "rollup/v1/"
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
