"""Work items as Arrow from the plan to the executors (PROTOCOL §3.9): task assignment is
column-wise, each task's items travel as one Arrow IPC blob and decode to exactly them."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from rollup.job.stages import Assignment, assign_tasks, task_blobs, task_count
from rollup.job.tasks import WORK_BLOB_SCHEMA, WORK_SCHEMA, WorkBlobs


def items(sources: dict[str, list[int]]) -> pa.Table:
    """Work items: per source (``agent=..boot=..``), one batch per record count given."""
    rows: list[tuple[object, ...]] = []
    for source, counts in sources.items():
        seq = 0
        for count in counts:
            mid = f"{source}.{seq:020d}-{seq + count - 1:020d}"
            sha = f"{len(rows):064x}"
            rows.append((mid, sha, f"raw/{sha}", "2026-11-27T08", count, None, None, None))
            seq += count
    columns = list(zip(*rows, strict=True))
    return pa.table(
        [pa.array(c, f.type) for c, f in zip(columns, WORK_SCHEMA, strict=True)],
        schema=WORK_SCHEMA,
    )


def tasks_of(work: pa.Table, assignment: Assignment) -> dict[int, list[str]]:
    """Each task's manifest_ids, in the order the task gets them."""
    mids = work.column("manifest_id").to_pylist()
    out = {int(assignment.task[rows[0]]): [mids[i] for i in rows] for rows in assignment.runs()}
    for i, task in enumerate(assignment.task.tolist()):  # the per-row column agrees
        assert mids[i] in out[task]
    return out


def test_sources_stay_together_and_tasks_are_balanced() -> None:
    work = items({f"agent=a{n}.boot=b": [10] * 10 for n in range(8)})  # 8 sources of 100

    work = work.take(pa.array(list(range(79, -1, -1))))  # any order in
    assigned = assign_tasks(work, 4)

    groups = tasks_of(work, assigned)
    assert sorted(groups) == [0, 1, 2, 3]
    for mids in groups.values():
        assert len({m.rsplit(".", 1)[0] for m in mids}) == 2  # two whole sources each
        assert mids == sorted(mids)  # sequence order
    assert sorted(m for mids in groups.values() for m in mids) == sorted(
        work.column("manifest_id").to_pylist()
    )


def test_a_large_source_is_cut_into_runs_of_consecutive_batches() -> None:
    work = items({"agent=big.boot=b": [10] * 40, "agent=small.boot=b": [10] * 4})

    assigned = assign_tasks(work, 4)  # share: 110 records

    groups = tasks_of(work, assigned)
    task = pa.array(assigned.task)
    totals = {
        t: int(pc.sum(work.filter(pc.equal(task, t))["record_count"]).as_py()) for t in groups
    }
    # runs of [k*110, (k+1)*110) records: 110, 110, 110, 70; the small source joins the 70
    assert sorted(totals.values()) == [110, 110, 110, 110]
    runs = [mids for mids in groups.values() if mids[0].startswith("agent=big")]
    starts = sorted(int(m.rsplit(".", 1)[1].split("-")[0]) for mids in runs for m in mids[:1])
    assert starts == [0, 110, 220, 330]
    assert task_count(work, 1) == 2 and task_count(work.slice(0, 1), 8) == 1


def test_each_task_decodes_exactly_its_items() -> None:
    work = items({f"agent=a{n}.boot=b": [5, 7, 9] for n in range(5)})
    assigned = assign_tasks(work, 3)

    blobs = task_blobs(work, assigned)

    class Collect:
        def run(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            for batch in batches:
                assert batch.schema.equals(WORK_SCHEMA)
                yield batch

    decoded = []
    for blob in blobs:  # one Spark partition per blob, as run_stages parallelizes them
        rows = pa.record_batch([pa.array([blob], pa.binary())], schema=WORK_BLOB_SCHEMA)
        decoded.append(pa.Table.from_batches(WorkBlobs(Collect()).run(iter([rows]))))
    expected = tasks_of(work, assigned)
    assert len(blobs) == len(expected) == 3
    for task, table in enumerate(decoded):
        assert table.column("manifest_id").to_pylist() == expected[task]
    assert pa.concat_tables(decoded).sort_by("manifest_id").equals(work.sort_by("manifest_id"))
    empty = WORK_SCHEMA.empty_table()
    assert task_blobs(empty, assign_tasks(empty, 4)) == []
