"""The Spark plan of a rollup run: work items → stage 1 → shuffle by hour → stage 2.

```
work items (parallelize, balanced by records)
  └─ mapInArrow(process_frames)         fetch, verify, decode, write points, pre-aggregate
       └─ groupBy("hour")                shuffles partials (series strings, no label maps)
            └─ applyInArrow(write_hour)  merge with committed rows, write rollup_1m + ledger
                 └─ toArrow()            file, ledger and problem records for the driver
```

One Spark action per run, so stage 1 runs once (its files are written once; a retried
or speculative task only adds orphans). The executor functions live in `rollup.frame_stage` and `rollup.hour_stage`
and know nothing of Spark.
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
    partitions = task_count(items, context.defaultParallelism)
    ordered = balanced_order(items, partitions)
    work = spark.createDataFrame(
        context.parallelize([item.as_row() for item in ordered], partitions),
        schema=from_arrow_schema(WORK_SCHEMA),
    )
    spark.conf.set("spark.sql.shuffle.partitions", str(max(1, context.defaultParallelism)))
    stage1 = work.mapInArrow(FrameStage(options).run, from_arrow_schema(STAGE1_SCHEMA))
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


def balanced_order(items: list[WorkItem], partitions: int) -> list[WorkItem]:
    """``items`` ordered so that ``parallelize``'s equal-count contiguous slices get
    similar record totals: largest first, dealt greedily to the lightest slice, with
    each slice's item count fixed to what parallelize will cut."""
    count = len(items)
    sizes = [(count * (i + 1)) // partitions - (count * i) // partitions for i in range(partitions)]
    bins: list[list[WorkItem]] = [[] for _ in range(partitions)]
    lightest = [(0, i) for i in range(partitions) if sizes[i] > 0]
    heapq.heapify(lightest)
    for item in sorted(items, key=lambda it: (-it.record_count, it.manifest_id)):
        total, target = heapq.heappop(lightest)
        bins[target].append(item)
        if len(bins[target]) < sizes[target]:
            heapq.heappush(lightest, (total + item.record_count, target))
    return [item for part in bins for item in part]
