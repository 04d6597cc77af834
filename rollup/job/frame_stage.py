"""Stage 1 of a rollup run: accepted batches → ``points`` files, partials, records.

`FrameStage.run` (one call per input partition, through ``mapInArrow``): the task's work
items' frames are read by raw object (`rollup.job.raw_frames`: a frame blob whole, a
bundle whole or as coalesced ranges, PROTOCOL §3.10); each is verified (sha256),
decoded with `protocol.frame`, checked to be the batch the accepted manifest names, and
turned into ``points`` rows. Rows are
written (streamed, one Parquet file per task and hour) to ``points`` and pre-aggregated
into per-(minute, series) partials. Out come `rollup.job.tasks.STAGE1_SCHEMA` rows, each
with the ``hour`` that routes it to stage 2:

- ``partials`` / ``series``: per hour, the task's merged partials and the metric and
  labels of their series, as Arrow IPC blobs;
- ``series_counts``: per hour, the task's points per series (count, first and last
  ``ts``, `rollup.table.series_rows`) of the points it wrote, as an Arrow IPC blob;
- ``points_file``, ``ledger`` (one per included batch, routed by its accepted hour, with
  its point range ``min_ts``/``max_ts``) and
  ``problem`` (a frame that is missing, fails its hash, decode or identity check, or a
  ``bad-range``: a record's range its bundle cannot serve): JSON.

Rows in hours a table's retention dropped, and rows that the base snapshot's tombstones
mask (`rollup.table.tombstones`), are dropped from the points written and from the partials
(each table by its own cutoff and tombstones); the batch is still included in the
ledger with all its records (``late_excluded`` when retention left none of its rows).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from index.raw_reads import BadRange
from protocol import keys
from protocol.frame import Frame
from rollup.job.raw_frames import FrameRead, StoreRawSource, task_frames
from rollup.job.tasks import (
    STAGE1_SCHEMA,
    WORK_SCHEMA,
    HourInputs,
    WriteOptions,
    distinct_series_info,
    file_body,
    output_batches,
    record,
    records_table,
    to_ipc,
    utc_hour,
)
from rollup.table import aggregate, series_rows
from rollup.table.batch_frames import BadFrame, check_frame
from rollup.table.points import hour_index, split_by_hour
from rollup.table.schemas import POINTS_SCHEMA, file_stats, merged_stats
from rollup.table.storage import open_parquet_writer
from rollup.table.tombstones import drop_from_points

# Partials per IPC blob (~15 MB): with `spark_session.JOB_CONF`'s Arrow batch cap, one
# Arrow batch of blobs stays far below the 2 GiB of a binary column's int32 offsets.
_PARTIALS_PER_BLOB = 100_000


@dataclass(frozen=True, slots=True)
class FrameStage:
    """Stage 1 as a picklable callable for ``mapInArrow`` (`run`)."""

    options: WriteOptions
    inputs: HourInputs = field(default_factory=HourInputs)

    def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """Stage 1 over the work items in ``batches`` (`WORK_SCHEMA`); see the module doc."""
        task = _FrameTask(self.options, self.inputs)
        items = pa.Table.from_batches(list(batches), schema=WORK_SCHEMA)
        source = StoreRawSource(self.options.access)
        reads = task_frames(source, items, max_frame_bytes=self.options.max_raw_bytes)
        for item, read in reads:
            task.add(item, read)
        yield from output_batches(task.finish(), STAGE1_SCHEMA)


class _FrameTask:
    """One stage-1 task: frames in, points files written, partials and records out.

    Points are buffered up to `WriteOptions.chunk_rows`, then pre-aggregated together
    and appended to the task's points file of each hour they fall in."""

    def __init__(self, options: WriteOptions, inputs: HourInputs) -> None:
        self._options = options
        self._inputs = inputs
        self._buffered: list[pa.Table] = []
        self._sources: list[tuple[str, str, int]] = []  # (agent_id, boot_id, rows) per frame
        self._by_hour: dict[int, list[pa.Table]] = {}
        self._buffered_rows = 0
        self._partials: list[pa.Table] = []
        self._infos: list[pa.Table] = []
        self._files: dict[int, PointsFile] = {}
        self._records: list[dict[str, Any]] = []
        self._series_counts: list[pa.Table] = []

    def add(self, item: dict[str, Any], read: FrameRead) -> None:
        try:
            frame, points = self._decode(item, read)
        except BadFrame as bad:
            self._records.append(record("problem", item["accepted_hour"], bad.as_dict(item)))
            return
        for_points, for_rollup, late = table_rows(self._inputs, points)
        self._records.append(
            record(
                "ledger",
                item["accepted_hour"],
                {
                    "manifest_id": item["manifest_id"],
                    "frame_sha256": item["frame_sha256"],
                    "record_count": points.num_rows,
                    "accepted_hour": item["accepted_hour"],
                    "late_excluded": late,
                    **point_range(points),
                },
            )
        )
        self._buffered.append(for_rollup)
        self._sources.append((frame.agent_id, str(frame.boot_id), for_rollup.num_rows))
        # Split per frame: a frame rarely spans an hour, so this seldom filters anything.
        for hour, rows in split_by_hour(for_points).items():
            self._by_hour.setdefault(hour, []).append(rows)
        self._buffered_rows += points.num_rows
        if self._buffered_rows >= self._options.chunk_rows:
            self._flush()

    def _decode(self, item: dict[str, Any], read: FrameRead) -> tuple[Frame, pa.Table]:
        key = item["raw_blob_key"]
        if isinstance(read, BadRange):
            raise BadFrame(read.kind, key, read.detail)
        return check_frame(
            read,
            blob_key=key,
            frame_sha256=item["frame_sha256"],
            manifest_id=item["manifest_id"],
            max_raw_bytes=self._options.max_raw_bytes,
        )

    def _flush(self) -> None:
        if not self._buffered:
            return
        chunk = pa.concat_tables(self._buffered)
        self._partials.append(aggregate.partials_of_points(chunk, self._sources))
        self._infos.append(aggregate.series_info(chunk))
        for hour, parts in self._by_hour.items():
            if hour not in self._files:
                self._files[hour] = PointsFile(self._options, utc_hour(hour))
            rows = pa.concat_tables(parts)
            self._files[hour].write(rows)
            self._series_counts.append(series_rows.hour_counts(rows))
        self._buffered, self._sources, self._by_hour, self._buffered_rows = [], [], {}, 0

    def finish(self) -> pa.Table:
        self._flush()
        parts: list[pa.Table] = []
        for points_file in self._files.values():
            parts.append(records_table([points_file.close()]))
        if self._partials:
            merged = aggregate.merge_partials(pa.concat_tables(self._partials))
            info = distinct_series_info(pa.concat_tables(self._infos))
            parts.append(_blob_rows(merged, info))
        if self._series_counts:
            counts = series_rows.combine(pa.concat_tables(self._series_counts), "hour_start")
            parts.append(_series_count_rows(counts))
        parts.append(records_table(self._records))
        return pa.concat_tables(parts)


class PointsFile:
    """One ``points`` Parquet file of a task and hour, written as chunks arrive."""

    def __init__(self, options: WriteOptions, hour: keys.UtcHour) -> None:
        self._options = options
        self.hour = hour
        self.path = keys.rollup_data_key("points", hour, str(uuid.uuid4()))
        self._writer, self._stream = open_parquet_writer(
            options.access, self.path, POINTS_SCHEMA, compression=options.parquet_compression
        )
        self._rows = 0
        self._stats: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def write(self, rows: pa.Table) -> None:
        # Sorted by (series, ts) in small row groups, so that a selector of one series
        # reads few of them (PROTOCOL §5). A file written in one chunk (up to
        # `WriteOptions.chunk_rows` rows of a task and hour: the usual case) is sorted
        # whole; a larger one is one sorted run per chunk, and a selector reads about
        # one row group per run (a bounded buffer, never the whole hour in memory).
        rows = series_rows.sort_points(rows)
        self._writer.write_table(rows, row_group_size=self._options.points_row_group_size)
        self._rows += rows.num_rows
        self._stats.append(file_stats(rows))

    def close(self) -> dict[str, Any]:
        self._writer.close()
        size = self._stream.tell()
        self._stream.close()
        low, high = merged_stats(self._stats)
        return record(
            "points_file",
            self.hour.iso,
            file_body("points", self.path, self.hour, self._rows, size, low, high),
        )


def table_rows(inputs: HourInputs, points: pa.Table) -> tuple[pa.Table, pa.Table, bool]:
    """One batch's rows as each table will hold them, ``(points, rows for rollup_1m,
    late)``: without rows in hours retention dropped, nor rows the base snapshot's deletes
    mask (so a late batch can bring back neither). ``late``: retention dropped every row
    from every table; the batch is still in the ledger with all its records."""
    kept: list[pa.Table] = []
    for table in ("points", "rollup_1m"):
        first_kept = inputs.first_kept.get(table)
        if first_kept is None:
            kept.append(points)
            continue
        cutoff = pa.scalar(first_kept, type=points.schema.field("ts").type)
        kept.append(points.filter(pc.greater_equal(points.column("ts"), cutoff)))
    late = points.num_rows > 0 and all(rows.num_rows == 0 for rows in kept)
    for_points, for_rollup = drop_from_points(inputs.tombstones, kept[0], kept[1])
    return for_points, for_rollup, late


def point_range(points: pa.Table) -> dict[str, int | None]:
    """A batch's ledger ``min_ts``/``max_ts`` (µs since the epoch) from its decoded
    ``points`` rows, before retention or deletes drop any (PROTOCOL §4: where a
    retraction finds its points)."""
    if points.num_rows == 0:
        return {"min_ts": None, "max_ts": None}
    bounds = pc.min_max(points.column("ts").cast(pa.int64()))
    return {"min_ts": bounds["min"].as_py(), "max_ts": bounds["max"].as_py()}


def _series_count_rows(counts: pa.Table) -> pa.Table:
    """Per hour of ``counts`` (`series_rows.HOUR_COUNTS_SCHEMA`), its rows as one Arrow
    IPC blob (kind ``series_counts``): stage 2 combines every task's and writes ``series``."""
    hours = hour_index(counts.column("hour_start").cast(pa.int64()).to_numpy())
    kinds: list[str] = []
    names: list[str] = []
    blobs: list[bytes] = []
    for hour in np.unique(hours):
        kinds.append("series_counts")
        names.append(utc_hour(int(hour)).iso)
        blobs.append(to_ipc(counts.filter(pa.array(hours == hour))))
    count = len(kinds)
    return pa.Table.from_arrays(
        [pa.array(kinds), pa.array(names), pa.nulls(count, pa.string()), pa.array(blobs)],
        schema=STAGE1_SCHEMA,
    )


def _blob_rows(merged: pa.Table, info: pa.Table) -> pa.Table:
    """Per hour of ``merged``: its partials, and the metric and labels of its series, as
    Arrow IPC blobs (a few large rows are all Spark has to shuffle; see `rollup.job.stages`)."""
    hours = hour_index(merged.column("window_us").to_numpy())
    kinds: list[str] = []
    names: list[str] = []
    blobs: list[bytes] = []
    for hour in np.unique(hours):
        name = utc_hour(int(hour)).iso
        partials = merged.filter(pa.array(hours == hour))
        for start in range(0, partials.num_rows, _PARTIALS_PER_BLOB):
            kinds.append("partials")
            names.append(name)
            blobs.append(to_ipc(partials.slice(start, _PARTIALS_PER_BLOB)))
        series = pc.unique(partials.column("series"))
        kinds.append("series")
        names.append(name)
        blobs.append(to_ipc(info.filter(pc.is_in(info.column("series"), value_set=series))))
    count = len(kinds)
    return pa.Table.from_arrays(
        [pa.array(kinds), pa.array(names), pa.nulls(count, pa.string()), pa.array(blobs)],
        schema=STAGE1_SCHEMA,
    )
