"""One Parquet data file of a rollup table as a snapshot lists it (PROTOCOL §4), and how a
written file's record is made (`describe_file`: row count and column statistics). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from protocol import keys
from rollup.table import schemas


@dataclass(frozen=True, slots=True)
class DataFile:
    """One Parquet file of a table, at ``path`` (an object key relative to the store root)."""

    path: str
    table: str
    partition: keys.UtcHour
    row_count: int
    size_bytes: int
    min: Mapping[str, Any] = field(default_factory=dict)
    max: Mapping[str, Any] = field(default_factory=dict)
    added_version: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "partition": {"date": self.partition.day.isoformat(), "hour": self.partition.hour},
            "row_count": self.row_count,
            "size_bytes": self.size_bytes,
            "min": dict(self.min),
            "max": dict(self.max),
            "added_version": self.added_version,
        }


def describe_file(
    table: str,
    path: str,
    partition: keys.UtcHour,
    rows: Any,
    *,
    size_bytes: int,
    added_version: int,
) -> DataFile:
    """The `DataFile` record of a written Parquet file holding ``rows`` (a pyarrow Table),
    with its row count and column statistics (`schemas.file_stats`)."""
    mins, maxs = schemas.file_stats(rows)
    return DataFile(
        path=path,
        table=table,
        partition=partition,
        row_count=rows.num_rows,
        size_bytes=size_bytes,
        min=mins,
        max=maxs,
        added_version=added_version,
    )
