"""The Spark plan of a rollup run: work items → stage 1 → shuffle by hour → stage 2.

```
work items                          one slice per task: grouped by source, balanced
  └─ mapInArrow(FrameStage.run)     fetch, verify, decode, write points, pre-aggregate
       └─ groupBy("hour")           shuffles per-(task, hour) Arrow IPC blobs of partials
            └─ applyInArrow(hour)   merge with committed rows, write rollup_1m + ledger
                 └─ toArrow()       file, ledger and problem records for the driver
```

One Spark action per run, so stage 1 runs once (its files are written once; a retried
or speculative task only adds orphans). The executor code (`rollup.frame_stage`,
`rollup.hour_stage`) knows nothing of Spark.
"""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from rollup.frame_stage import FrameStage
from rollup.hour_stage import hour_stage
from rollup.plan import WorkItem
from rollup.tasks import RESULT_SCHEMA, STAGE1_SCHEMA, WORK_SCHEMA, HourInputs, WriteOptions

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
    items: list[WorkItem],
    options: WriteOptions,
    inputs: HourInputs,
) -> list[StageRecord]:
    """Run both stages over ``items`` and return stage 2's records (blocking)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    context = spark.sparkContext
    tasks = assign_tasks(items, task_count(items, context.defaultParallelism))
    rows = [[item.as_row() for item in task] for task in tasks]
    # One list per slice, so each stage-1 task gets exactly the items assigned to it.
    work = spark.createDataFrame(
        context.parallelize(rows, len(rows)).flatMap(_each),
        schema=from_arrow_schema(WORK_SCHEMA),
    )
    spark.conf.set("spark.sql.shuffle.partitions", str(max(1, context.defaultParallelism)))
    stage1 = work.mapInArrow(FrameStage(options, inputs).run, from_arrow_schema(STAGE1_SCHEMA))
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


def task_count(items: list[WorkItem], parallelism: int) -> int:
    """Two tasks per core (a core slowed by other load leaves its second task to an idle
    one), more when a task would exceed `MAX_RECORDS_PER_TASK`; never more than items."""
    if not items:
        return 1
    records = sum(item.record_count for item in items)
    wanted = max(TASKS_PER_CORE * parallelism, math.ceil(records / MAX_RECORDS_PER_TASK))
    return max(1, min(len(items), wanted))


def assign_tasks(items: list[WorkItem], tasks: int) -> list[list[WorkItem]]:
    """Split ``items`` into at most ``tasks`` groups with similar record totals, keeping
    each source's (agent, boot) batches together, in sequence order, where it can.

    A series belongs to one source, so a task that holds all of a source's batches emits
    the only partials of its series: the shuffle and stage 2 carry each (minute, series)
    once instead of once per task. A source larger than a task's share is cut into runs
    of consecutive batches (their partials overlap only in the minutes at the cuts).
    Pieces are then dealt largest first to the lightest task."""
    if not items:
        return []
    target = max(1, math.ceil(sum(item.record_count for item in items) / tasks))
    by_source: dict[str, list[WorkItem]] = {}
    for item in items:
        by_source.setdefault(item.manifest_id.rsplit(".", 1)[0], []).append(item)
    pieces: list[list[WorkItem]] = []
    for batches in by_source.values():
        piece: list[WorkItem] = []
        size = 0
        for item in sorted(batches, key=lambda it: it.manifest_id):  # zero-padded seq order
            piece.append(item)
            size += item.record_count
            if size >= target:
                pieces.append(piece)
                piece, size = [], 0
        if piece:
            pieces.append(piece)
    groups: list[list[WorkItem]] = [[] for _ in range(min(tasks, len(pieces)))]
    lightest = [(0, i) for i in range(len(groups))]
    for piece in sorted(
        pieces, key=lambda p: (-sum(it.record_count for it in p), p[0].manifest_id)
    ):
        total, index = heapq.heappop(lightest)
        groups[index] += piece
        heapq.heappush(lightest, (total + sum(it.record_count for it in piece), index))
    return groups


def _each(rows: list[tuple[str, str, str, str, int]]) -> list[tuple[str, str, str, str, int]]:
    return rows
