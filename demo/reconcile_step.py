"""The demo's reconciler step: lose what a crash would lose, then let the reconciler mend it.

1. Deletes the index log segment that alone names the most records (as if its rows had
   died with their collector before the flush) and writes one raw blob with no manifest
   and no log row (as if a collector died between its two writes).
2. Runs ``lm-reconciler run --once``: the steady pass catalogs what the remaining log
   names, and the first audit (a full listing of ``accepted/v1/`` and ``quarantine/v1/``
   anti-joined with the catalog) catalogs exactly the records the lost segment named; its
   blob join lists the orphan for the GC, which marks it. The demo uses a 1-second retry
   horizon and a few seconds of mark grace so the whole mark → grace → audit → delete
   sequence fits in the demo (production defaults are 2 days and 10 minutes).
3. After the grace, runs it again: the GC deletes the orphan. Then ``lm-reconciler status``
   must show no log segment waiting, the catalog, and zero problems.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from index.log_reader import read_segment
from protocol import keys
from protocol.frame_encode import encode_frame, points_table
from store.fs import FileSystemStore

GRACE_S = 4.0
DEMO_GC_ENV = {
    "LM_GC__RETRY_HORIZON_S": "1",
    "LM_GC__MARK_GRACE_S": str(GRACE_S),
    # The grace must outlast a collector request; these bound one in the demo's settings.
    "LM_INGEST__REQUEST_BUDGET_S": "1",
    "LM_STORE__CONNECT_TIMEOUT_S": "1",
    "LM_STORE__READ_TIMEOUT_S": "1",
    "LM_RECONCILER__LEASE_TTL_S": "10",
    "LM_GC__DELETE_EXPIRY_S": "2",  # a signed delete expires within a third of the lease
    # One host, one clock: a tight skew limit, so expiry + skew fit in 2/3 of the lease.
    "LM_STORE__MAX_CLOCK_SKEW_S": "2",
}


async def damage(store_dir: Path) -> tuple[str, set[str], str]:
    """Delete the log segment naming the most records no other segment names, and add an
    orphan blob; return the segment, the records only it named, and the orphan's hash."""
    store = FileSystemStore(store_dir)
    try:
        named: dict[str, set[str]] = {}
        async for info in store.list(keys.INDEX_LOG_PREFIX):
            rows = await read_segment(store, info.key)
            named[info.key] = {row.key for row in rows if row.kind != "blob"}

        def alone(segment: str) -> set[str]:
            others = set().union(*(found for key, found in named.items() if key != segment))
            return named[segment] - others

        lost_segment = max(named, key=lambda segment: len(alone(segment)))
        lost = alone(lost_segment)
        await store.delete(lost_segment)
        points = points_table([time.time_ns()], ["demo_orphan"], [1.0], [None])
        frame = encode_frame(
            agent_id="demo-crashed-collector", boot_id=uuid.uuid4(), seq_start=0, points=points
        )
        orphan_sha = hashlib.sha256(frame).hexdigest()
        await store.put(keys.raw_blob_key(orphan_sha), frame)
    finally:
        await store.close()
    return lost_segment, lost, orphan_sha


def reconcile(store_dir: Path, *args: str) -> dict[str, Any]:
    """Run ``lm-reconciler`` with the demo's settings and return its JSON output."""
    env = {**os.environ, "LM_STORE__URL": f"file://{store_dir}", **DEMO_GC_ENV}
    done = subprocess.run(
        [sys.executable, "-m", "reconciler", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"lm-reconciler {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}"
        )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def describe_pass(report: dict[str, Any]) -> str:
    steady = report.get("steady") or {}
    audit = report.get("audit") or {}
    gc = (report.get("gc") or {}).get("record") or {}
    audit_text = (
        f"audit cataloged {audit.get('cataloged', 0)} records the log had lost, "
        f"{audit.get('orphans', 0)} orphan(s) listed"
        if audit
        else "no audit due"
    )
    return (
        f"log: {steady.get('segments', 0)} segments read, {steady.get('rows_cataloged', 0)} "
        f"records cataloged; {audit_text}; GC: {gc.get('candidates', 0)} candidates, "
        f"{gc.get('marked', 0)} marked, {gc.get('deleted', 0)} deleted"
    )


def describe_status(status: dict[str, Any]) -> str:
    log, catalog = status["log"], status["catalog"]
    cost = status["index_requests_per_batch"]
    return (
        f"{log['segments_behind']} log segments waiting; catalog: {catalog['files']} files "
        f"in {catalog['hours']} hours, {catalog['rollup_work_markers']} rollup work markers; "
        f"{'n/a' if cost is None else cost} index requests per batch; "
        f"{status['problems']['total']} problems"
    )


def run(store_dir: Path, step: Any) -> list[str]:
    """The whole reconciler step; returns problems found (empty when all is well)."""
    problems: list[str] = []
    segment, lost, orphan = asyncio.run(damage(store_dir))
    step(
        f"reconciler: simulating a collector crash before its log flush (1 log segment "
        f"deleted: {len(lost)} records only it named) and between its two writes "
        "(1 orphan raw blob, never logged)"
    )
    time.sleep(1.5)  # let the orphan pass the demo's 1-second retry horizon
    first = reconcile(store_dir, "run", "--once")
    print(f"    pass 1: {describe_pass(first)}")
    time.sleep(GRACE_S + 0.5)  # the mark grace: longer than any collector request may take
    print(f"    pass 2: {describe_pass(reconcile(store_dir, 'run', '--once'))}")
    cataloged = (first.get("audit") or {}).get("cataloged")
    if cataloged != len(lost):
        problems.append(
            f"the audit cataloged {cataloged} records; the deleted segment {segment} alone "
            f"named {len(lost)}"
        )
    if (store_dir / keys.raw_blob_key(orphan)).exists():
        problems.append("the orphan raw blob was not collected")
    status = reconcile(store_dir, "status", "--json")
    step(f"lm-reconciler status: {describe_status(status)}")
    if status["log"]["segments_behind"] != 0 or status["problems"]["total"] != 0:
        problems.append(
            f"reconciler status shows {status['log']['segments_behind']} log segments waiting "
            f"and {status['problems']['total']} problems"
        )
    return problems
