"""The full audit's listing parts (PROTOCOL §3.9): their Parquet schema, their names and
the buffer a part is filled in (`reconciler.audit.listing` writes and resumes them).

A part is ``<audit_dir><kind>/<range:05d>-<part:06d>-n<rows>[-final].parquet``: a range's
parts sort in key order, the name carries the row count (finished ranges need no GET),
and ``-final`` marks the part that ends its range.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from reconciler.audit.ranges import KINDS, ListingKind
from store.base import ObjectInfo

LISTING_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("etag", pa.string()),
        ("size", pa.int64()),
        ("last_modified", pa.timestamp("us", tz="UTC")),
    ]
)
"""ETag exactly as the store returned it (the joins normalize); ``last_modified`` in the
store's time. From an inventory, ``etag``/``size``/``last_modified`` may be null."""
BYTES_PER_KEY = 160
"""About what one key costs a part in memory (`PART_KEYS`), to size the encoding's work."""
_PART_RE = re.compile(r"(\d{5})-(\d{6})-n(\d+)(-final)?\.parquet")


@dataclass(frozen=True, slots=True)
class Part:
    key: str
    range_index: int
    number: int
    rows: int
    final: bool


def part_name(kind: ListingKind, range_index: int, number: int, rows: int, final: bool) -> str:
    return f"{kind}/{range_index:05d}-{number:06d}-n{rows}{'-final' if final else ''}.parquet"


def parse_part(audit_dir: str, key: str) -> tuple[ListingKind, Part] | None:
    """The listing part at ``key``; ``None`` for anything else in the folder (the plan,
    inventory parts, a file of someone else's: never read as a part)."""
    kind_name, _, name = key.removeprefix(audit_dir).partition("/")
    match = _PART_RE.fullmatch(name)
    for kind in KINDS:
        if kind == kind_name and match is not None:
            index, number, rows, final = match.groups()
            return kind, Part(key, int(index), int(number), int(rows), final is not None)
    return None


class PartBuffer:
    """One part's columns, filled key by key (plain lists: cheaper per key than Arrow
    builders from Python)."""

    __slots__ = ("etags", "keys", "modified_us", "sizes")

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.etags: list[str | None] = []
        self.sizes: list[int | None] = []
        self.modified_us: list[int | None] = []

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, info: ObjectInfo) -> None:
        self.keys.append(info.key)
        self.etags.append(info.etag)
        self.sizes.append(info.size)
        self.modified_us.append(info.last_modified_ns // 1000)

    def add_row(
        self, key: str, etag: str | None, size: int | None, modified_ns: int | None
    ) -> None:
        self.keys.append(key)
        self.etags.append(etag)
        self.sizes.append(size)
        self.modified_us.append(None if modified_ns is None else modified_ns // 1000)

    def parquet(self, metadata: dict[str, str]) -> bytes:
        table = pa.Table.from_arrays(
            [
                pa.array(self.keys, pa.string()),
                pa.array(self.etags, pa.string()),
                pa.array(self.sizes, pa.int64()),
                pa.array(self.modified_us, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            ],
            schema=LISTING_SCHEMA.with_metadata(metadata),
        )
        sink = io.BytesIO()
        pq.write_table(table, sink, compression="zstd")
        return sink.getvalue()
