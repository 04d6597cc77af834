"""The demo's reconciler step: break what a crash or a full queue would break, then repair.

1. Deletes a few derived index entries (as if the collector's background queue dropped
   them) and writes one raw blob with no manifest (as if a collector died between its
   two writes).
2. Runs ``lm-reconciler run --once``: the audit restores the entries, the GC marks the
   orphan. The demo uses a 1-second retry horizon and a few seconds of mark grace so the
   whole mark → grace → audit → delete sequence fits in the demo (production defaults
   are 2 days and 10 minutes).
3. After the grace, runs it again: a fresh audit proves nothing references the orphan,
   and the GC deletes it. Then ``lm-reconciler status`` must show zero lag and zero
   problems.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from protocol import keys
from protocol.frame import encode_frame, points_table
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


async def damage(store_dir: Path, how_many: int = 5) -> tuple[list[str], str]:
    """Delete some derived entries and add an orphan blob; return what was done."""
    store = FileSystemStore(store_dir)
    deleted: list[str] = []
    for prefix in (keys.ACCEPTED_BY_BLOB_PREFIX, keys.ACCEPTED_BY_TIME_PREFIX):
        async for info in store.list(prefix):
            if len([k for k in deleted if k.startswith(prefix)]) == how_many:
                break
            deleted.append(info.key)
    for key in deleted:
        await store.delete(key)
    points = points_table([time.time_ns()], ["demo_orphan"], [1.0], [None])
    frame = encode_frame(
        agent_id="demo-crashed-collector", boot_id=uuid.uuid4(), seq_start=0, points=points
    )
    orphan_sha = hashlib.sha256(frame).hexdigest()
    await store.put(keys.raw_blob_key(orphan_sha), frame)
    await store.close()
    return deleted, orphan_sha


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
    audit = report.get("audit") or {}
    gc = (report.get("gc") or {}).get("record") or {}
    repaired = {**(report.get("steady") or {}).get("repaired", {})}
    for kind, count in (audit.get("repaired") or {}).items():
        repaired[kind] = repaired.get(kind, 0) + count
    return (
        f"repaired {sum(repaired.values())} entries {repaired or ''}; "
        f"GC: {gc.get('candidates', 0)} candidates, {gc.get('marked', 0)} marked, "
        f"{gc.get('deleted', 0)} deleted"
    )


async def _present(store_dir: Path, keys_: list[str]) -> list[str]:
    store = FileSystemStore(store_dir)
    found = [key for key in keys_ if (store_dir / key).is_file()]
    await store.close()
    return found


def run(store_dir: Path, step: Any) -> list[str]:
    """The whole reconciler step; returns problems found (empty when all is well)."""
    import asyncio

    problems: list[str] = []
    deleted, orphan = asyncio.run(damage(store_dir))
    step(
        f"reconciler: simulating a dropped index queue ({len(deleted)} derived entries deleted) "
        "and a collector crash between its two writes (1 orphan raw blob)"
    )
    time.sleep(1.5)  # let the orphan pass the demo's 1-second retry horizon
    print(f"    pass 1: {describe_pass(reconcile(store_dir, 'run', '--once'))}")
    time.sleep(GRACE_S + 0.5)  # the mark grace: longer than any collector request may take
    print(f"    pass 2: {describe_pass(reconcile(store_dir, 'run', '--once'))}")
    restored = asyncio.run(_present(store_dir, deleted))
    if len(restored) != len(deleted):
        problems.append(
            f"only {len(restored)} of {len(deleted)} deleted index entries were restored"
        )
    if (store_dir / keys.raw_blob_key(orphan)).exists():
        problems.append("the orphan raw blob was not collected")
    status = reconcile(store_dir, "status", "--json")
    lag, problem_count = status["lag_hours"], status["problems"]["total"]
    step(f"lm-reconciler status: lag {lag} h, {problem_count} problems")
    if lag != 0 or problem_count != 0:
        problems.append(f"reconciler status shows lag {lag} h and {problem_count} problems")
    return problems
