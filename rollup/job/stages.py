"""The Spark plan of a rollup run: work items → stage 1 → shuffle by hour → stage 2.

```
work items                          one Arrow IPC blob per task: grouped by source, balanced
  └─ mapInArrow(WorkBlobs.run)      decode the task's blob, then FrameStage: fetch, verify,
                                    decode, write points, pre-aggregate
       └─ groupBy("hour")           shuffles per-(task, hour) Arrow IPC blobs of partials
            └─ applyInArrow(hour)   merge with committed rows, write rollup_1m + ledger
                 └─ toArrow()       file, ledger and problem records for the driver
```

One Spark action per run, so stage 1 runs once (its files are written once; a retried
or speculative task only adds orphans). The executor code (`rollup.job.frame_stage`,
`rollup.job.hour_stage`) knows nothing of Spark.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollup.job.frame_stage import FrameStage
from rollup.job.hour_stage import hour_stage
from rollup.job.tasks import (
    RESULT_SCHEMA,
    STAGE1_SCHEMA,
    WORK_BLOB_SCHEMA,
    HourInputs,
    WorkBlobs,
    WriteOptions,
    work_blob,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# A task holds one chunk of points at a time; this only bounds how long one runs.
MAX_RECORDS_PER_TASK = 20_000_000
TASKS_PER_CORE = 2


@dataclass(frozen=True, slots=True)
class StageRecord:
    """One record stage 2 returned: ``kind`` is ``points_file``, ``rollup_file``,
    ``ledger_file`` or ``problem``; ``body`` the decoded JSON."""

    kind: str
    hour: str
    body: dict[str, Any]


def run_stages(
    spark: SparkSession,
    items: pa.Table,
    options: WriteOptions,
    inputs: HourInputs,
) -> list[StageRecord]:
    """Run both stages over ``items`` (`rollup.job.tasks.WORK_SCHEMA`) and return stage 2's
    records (blocking).

    Each task's items travel as one Arrow IPC blob (PROTOCOL §3.9: never a pickled
    Python tuple per batch): the driver parallelizes one blob per slice, so each stage-1
    task decodes exactly the items `assign_tasks` gave it."""
    from pyspark.sql.pandas.types import from_arrow_schema

    context = spark.sparkContext
    blobs = task_blobs(items, assign_tasks(items, task_count(items, context.defaultParallelism)))
    work = spark.createDataFrame(
        context.parallelize([(blob,) for blob in blobs], max(1, len(blobs))),
        schema=from_arrow_schema(WORK_BLOB_SCHEMA),
    )
    spark.conf.set("spark.sql.shuffle.partitions", str(max(1, context.defaultParallelism)))
    stage1 = work.mapInArrow(
        WorkBlobs(FrameStage(options, inputs)).run, from_arrow_schema(STAGE1_SCHEMA)
    )
    stage2 = stage1.groupBy("hour").applyInArrow(
        hour_stage(options, inputs), from_arrow_schema(RESULT_SCHEMA)
    )
    table: pa.Table = stage2.toArrow()
    return [
        StageRecord(kind, hour, json.loads(body))
        for kind, hour, body in zip(
            table.column("kind").to_pylist(),
            table.column("hour").to_pylist(),
            table.column("body").to_pylist(),
            strict=True,
        )
    ]


def task_count(items: pa.Table, parallelism: int) -> int:
    """Two tasks per core (a core slowed by other load leaves its second task to an idle
    one), more when a task would exceed `MAX_RECORDS_PER_TASK`; never more than items."""
    if items.num_rows == 0:
        return 1
    records = int(pc.sum(items.column("record_count")).as_py() or 0)
    wanted = max(TASKS_PER_CORE * parallelism, math.ceil(records / MAX_RECORDS_PER_TASK))
    return max(1, min(int(items.num_rows), wanted))


@dataclass(frozen=True, slots=True)
class Assignment:
    """Which task each work item goes to (`assign_tasks`)."""

    task: np.ndarray
    """Per row of the items, in their order: the task index."""
    order: np.ndarray
    """The rows by (task, ``manifest_id``): a task's items are a contiguous run."""

    def runs(self) -> list[np.ndarray]:
        """Each task's rows (task 0 first), in ``manifest_id`` order."""
        if len(self.order) == 0:
            return []
        by_task = self.task[self.order]
        bounds = np.flatnonzero(np.diff(by_task)) + 1
        edges = [0, *bounds.tolist(), len(self.order)]
        return [self.order[a:b] for a, b in itertools.pairwise(edges)]


def assign_tasks(items: pa.Table, tasks: int) -> Assignment:
    """At most ``tasks`` groups of ``items`` with similar record totals, each source's
    (agent, boot) batches together, in sequence order, where it can. Column-wise: a
    Python step per piece, never per batch; only the ``manifest_id`` and
    ``record_count`` columns are copied (in ``manifest_id`` order), never the items.

    A series belongs to one source, so a task that holds all of a source's batches emits
    the only partials of its series: the shuffle and stage 2 carry each (minute, series)
    once instead of once per task. A source larger than a task's share is cut into runs
    of consecutive batches: a batch goes to run ``k`` of its source when the records of
    the source's batches before it are in ``[k * share, (k + 1) * share)`` (their
    partials overlap only in the minutes at the cuts). Pieces are then dealt largest
    first (ties: the least first ``manifest_id``) to the lightest task."""
    if items.num_rows == 0:
        empty = np.zeros(0, dtype=np.int64)
        return Assignment(empty.astype(np.int32), empty)
    by_id, source_rank = _by_source_and_sequence(items.column("manifest_id"))
    counts = items.column("record_count").to_numpy().astype(np.int64)[by_id]
    target = max(1, math.ceil(int(counts.sum()) / tasks))
    ranks = source_rank[by_id]
    starts = np.ones(len(counts), dtype=bool)
    starts[1:] = ranks[1:] != ranks[:-1]
    del ranks, source_rank
    source_id = np.cumsum(starts) - 1
    before = np.cumsum(counts) - counts  # records before each batch, over all sources
    before_in_source = before - before[np.flatnonzero(starts)][source_id]
    run = before_in_source // target
    piece_start = starts.copy()
    piece_start[1:] |= run[1:] != run[:-1]
    piece_id = np.cumsum(piece_start) - 1
    sizes = np.bincount(piece_id, weights=counts).astype(np.int64)
    firsts = np.flatnonzero(piece_start)  # in manifest_id order: first row = least id
    groups = min(tasks, len(sizes))
    lightest = [(0, i) for i in range(groups)]
    piece_task = np.empty(len(sizes), dtype=np.int32)
    for piece in np.lexsort((firsts, -sizes)):
        total, index = heapq.heappop(lightest)
        piece_task[piece] = index
        heapq.heappush(lightest, (total + int(sizes[piece]), index))
    task_by_id = piece_task[piece_id]
    task = np.empty(len(by_id), dtype=np.int32)
    task[by_id] = task_by_id
    return Assignment(task, by_id[np.argsort(task_by_id, kind="stable")])


_SEQUENCE_CHARS = 41
"""A ``manifest_id`` ends in ``.<seq_start:020d>-<seq_end:020d>``."""


def _by_source_and_sequence(ids: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """The rows in ``manifest_id`` order and each row's source (``agent=..boot=..``)
    rank, without a sorted copy of the ids: the source is dictionary-encoded (one code a
    row), then rows are ordered by (source, seq_start, seq_end), which is ``manifest_id``
    order (the sequence numbers are zero-padded to one width)."""
    source = pc.dictionary_encode(
        pc.utf8_slice_codeunits(ids, 0, -(_SEQUENCE_CHARS + 1))
    ).combine_chunks()
    names = source.dictionary
    rank_of_code = np.empty(len(names), dtype=np.int64)
    rank_of_code[pc.sort_indices(names).to_numpy()] = np.arange(len(names))
    source_rank = rank_of_code[source.indices.to_numpy()]
    del source
    seq_start = pc.cast(pc.utf8_slice_codeunits(ids, -_SEQUENCE_CHARS, -21), pa.uint64())
    seq_end = pc.cast(pc.utf8_slice_codeunits(ids, -20, 2**31 - 1), pa.uint64())
    order = np.lexsort(
        (
            seq_end.to_numpy(),
            seq_start.to_numpy(),
            source_rank,
        )
    )
    return order, source_rank


def task_blobs(items: pa.Table, assignment: Assignment) -> list[bytes]:
    """One `rollup.job.tasks.work_blob` per task (task 0 first), a task's items in
    ``manifest_id`` order; one task's rows are copied at a time."""
    return [work_blob(items.take(pa.array(rows))) for rows in assignment.runs()]
