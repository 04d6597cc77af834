"""``lm-reconciler`` as real processes on the filesystem store: run --once and status (text,
JSON, --check), the problems command, kill -9 in the middle of an audit, two daemons with
one active, an audit from an inventory, the GC's dry run, exit codes."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from pathlib import Path

from protocol import keys
from protocol.clock import SystemClock
from protocol.records import AuditRecord, GcRunRecord, LeaseRecord
from reconciler.daemon import Reconciler
from store.counting import CountingStore
from store.fs import FileSystemStore
from tests.reconciler.conftest import (
    Batch,
    catalog_keys,
    cli_env,
    finished_listing_ranges,
    log_rows,
    make_batch,
    make_settings,
    run_cli,
    start_cli,
    write_batch_files,
)
from tests.reconciler.test_inventory import store_rows, write_csv_inventory

DEADLINE_S = 30.0


def now_batches(root: Path, agents: int, per_agent: int) -> list[Batch]:
    """Batches accepted 10 s ago (all in one hour: they are nanoseconds apart)."""
    start = time.time_ns() - 10 * keys.NS_PER_S
    batches = []
    for agent in range(agents):
        for seq in range(per_agent):
            batch = make_batch(agent, seq, start + agent * per_agent + seq)
            write_batch_files(root, batch)
            batches.append(batch)
    return batches


def log_files(root: Path, batches: list[Batch]) -> list[str]:
    """The batches' index log rows, flushed by an `IndexLogWriter` into the fs store."""

    async def write() -> list[str]:
        store = FileSystemStore(root)
        try:
            return await log_rows(store, SystemClock(), batches)
        finally:
            await store.close()

    return asyncio.run(write())


def test_run_once_and_status_show_the_log_the_catalog_and_the_cost(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    batches = now_batches(store_dir, agents=3, per_agent=4)
    assert len(log_files(store_dir, batches[:8])) == 1  # the last agent's rows were lost
    env = cli_env(store_dir)

    before = run_cli("status", "--json", env=env)
    assert before.returncode == 0, before.stderr
    doc = json.loads(before.stdout)
    assert doc["log"]["through"] is None and doc["log"]["segments_behind"] == 1
    assert doc["catalog"] == {
        "hours": 0,
        "files": 0,
        "rollup_work_markers": 0,
        "catalog_created_entries": 0,
    }
    assert doc["index_requests_per_batch"] is None and doc["last_audit"] is None
    # Its segment has waited longer than a 1-second lookback: lag. (A lookback that short
    # needs a segment create's budget and the skew limit within it, PROTOCOL §3.7.)
    short = {
        "LM_RECONCILER__LOOKBACK_S": "1",
        "LM_STORE__MAX_CLOCK_SKEW_S": "0.2",
        "LM_STORE__CONNECT_TIMEOUT_S": "0.1",
        "LM_STORE__READ_TIMEOUT_S": "0.2",
        "LM_INGEST__INDEX_PUT_BUDGET_S": "0.5",
    }
    assert run_cli("status", "--check", env={**env, **short}).returncode == 1

    once = run_cli("run", "--once", env=env)
    assert once.returncode == 0, once.stderr
    report = json.loads(once.stdout)
    assert report["complete"] and report["steady"]["records_read"] == 8
    assert report["audit"]["status"] == "completed" and report["audit"]["cataloged"] == 4

    status = run_cli("status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["log"]["segments_behind"] == 0 and doc["log"]["lag_seconds"] == 0
    assert doc["log"]["totals"]["segments"] == 1 and doc["log"]["totals"]["accepted_rows"] == 8
    assert doc["catalog"]["hours"] == 1
    assert doc["catalog"]["files"] == doc["catalog"]["rollup_work_markers"] == 2  # pass + audit
    # The pass's entry is older than the completed audit's position: trimmed, GC or not.
    assert doc["catalog"]["catalog_created_entries"] == 1
    # (1 segment + 1 catalog file + 1 marker + 1 checkpoint) / 8 accepted rows
    assert doc["index_requests_per_batch"] == 0.5
    assert doc["last_completed_audit"]["manifests_seen"] == 12
    assert doc["last_completed_audit"]["cataloged"] == 4
    assert doc["last_gc"] is None and doc["problems"] == {"total": 0, "by_kind": {}}
    completed = doc["last_completed_audit"]  # what it cost (issue 23 item 5)
    assert completed["engine"] == "local" and completed["duration_s"] >= 0
    assert completed["keys_listed"]["accepted"] == 12 and completed["requests"]["LIST"] >= 3
    assert completed["requests"]["GET"] >= 1 and completed["spilled_bytes"] > 0
    text = run_cli("status", env=env).stdout
    assert "last GC         none" in text and "; engine local, " in text
    assert doc["lease"]["active"] is False  # released on exit
    assert run_cli("status", "--check", env=env).returncode == 0
    gc_run = GcRunRecord(run_id="00c0ffee", started_at_unix_ns=time.time_ns(), candidates=3)
    gc_run = gc_run.model_copy(update={"marked": 2, "deleted": 1})
    gc_key = store_dir / keys.gc_run_key(gc_run.started_at_unix_ns, gc_run.run_id)
    gc_key.parent.mkdir(parents=True, exist_ok=True)
    gc_key.write_bytes(gc_run.to_json())
    text = run_cli("status", env=env).stdout
    for line in (
        "0 segments waiting, lag 0.0 s",
        "catalog         1 hours in 2 files; 2 rollup work markers waiting; 1 catalog-created",
        "index cost      0.5 requests per accepted batch",
        "4 cataloged",
        "last GC         00c0ffee started",
        "3 candidates, 2 marked, 0 vetoed, 1 deleted",
        "problems        0",
    ):
        assert line in text, text
    assert asyncio.run(catalog_keys(FileSystemStore(store_dir))) == {b.key for b in batches}


def test_problems_are_listed_and_fail_the_status_check(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    batches = now_batches(store_dir, agents=1, per_agent=3)
    (store_dir / batches[1].manifest.raw_blob_key).unlink()
    env = cli_env(store_dir)

    assert run_cli("run", "--once", env=env).returncode == 0
    listed = run_cli("problems", "--json", env=env)

    assert listed.returncode == 0, listed.stderr
    [problem] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert problem["kind"] == "missing-blob"
    assert problem["subject_key"] == batches[1].manifest.raw_blob_key
    assert batches[1].key in problem["detail"]
    check = run_cli("status", "--check", env=env)
    assert check.returncode == 1
    assert "problems        1 (missing-blob 1)" in run_cli("status", env=env).stdout


def test_bad_configuration_exits_2(tmp_path: Path) -> None:
    result = run_cli("status", env=cli_env(tmp_path, LM_RECONCILER__CONCURENCY="3"))
    assert result.returncode == 2 and "reconciler.concurency" in result.stderr


def read_audit_record(store_dir: Path) -> AuditRecord | None:
    folder = store_dir / keys.RECONCILER_AUDITS_PREFIX
    files = sorted(folder.glob("*.json")) if folder.exists() else []
    try:
        return AuditRecord.from_json(files[-1].read_bytes()) if files else None
    except (OSError, ValueError):
        return None  # being replaced at this very moment: read again


async def test_kill_9_mid_audit_then_the_next_run_resumes(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    # Every record is read and cataloged (fsync'd catalog files and markers), one request at
    # a time: the audit takes several seconds, and its record is saved every 2 s while it
    # runs (or every 1,000 records cataloged): time to see it running and kill it.
    now_batches(store_dir, agents=30, per_agent=150)
    env = cli_env(store_dir, LM_RECONCILER__CONCURRENCY="1", LM_RECONCILER__LEASE_TTL_S="2")
    auditor = start_cli("audit", env=env, log_path=tmp_path / "audit.log")
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            record = read_audit_record(store_dir)
            if record is not None and record.status == "running" and record.manifests_seen >= 40:
                break
            assert auditor.poll() is None, (tmp_path / "audit.log").read_text()
            assert time.monotonic() < deadline, "no audit progress recorded in time"
            await asyncio.sleep(0.05)  # polling the record, bounded by the deadline
        os.kill(auditor.pid, signal.SIGKILL)
    finally:
        auditor.kill()
        auditor.wait()
    interrupted = read_audit_record(store_dir)
    assert interrupted is not None and interrupted.status == "running"
    assert interrupted.manifests_seen < 4500
    finished = await finished_listing_ranges(FileSystemStore(store_dir), interrupted)
    cataloged_before = await catalog_keys(FileSystemStore(store_dir))
    assert cataloged_before

    store = CountingStore(FileSystemStore(store_dir))
    reconciler = Reconciler(
        store=store,
        settings=make_settings(lease_ttl_s=2.0, verify_rate_per_s=100_000.0),
        clock=SystemClock(),
        rng=random.Random(9),
    )
    resumed = await reconciler.audit_once()  # waits out the dead process's lease (<= 2 s)

    assert resumed.status == "completed"
    assert resumed.audit_id == interrupted.audit_id
    assert resumed.started_at_unix_ns == interrupted.started_at_unix_ns
    assert resumed.manifests_seen >= 4500
    assert not set(store.lists) & finished  # no finished range is listed again
    assert not set(store.keys_of("get", keys.ACCEPTED_PREFIX)) & cataloged_before  # none re-read
    assert len(await catalog_keys(FileSystemStore(store_dir))) == 4500


def lease_on_disk(store_dir: Path) -> LeaseRecord | None:
    try:
        return LeaseRecord.from_json((store_dir / keys.RECONCILER_LEASE_KEY).read_bytes())
    except (OSError, ValueError):
        return None


def wait_for_lease(store_dir: Path, predicate, what: str) -> LeaseRecord:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        lease = lease_on_disk(store_dir)
        if lease is not None and predicate(lease):
            return lease
        time.sleep(0.05)  # polling the lease object, bounded by the deadline
    raise AssertionError(f"timed out waiting for {what}; lease is {lease_on_disk(store_dir)}")


def test_two_daemons_one_active_and_the_standby_takes_over_after_kill_9(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    now_batches(store_dir, agents=2, per_agent=3)
    env = cli_env(store_dir, LM_RECONCILER__LEASE_TTL_S="1.5", LM_RECONCILER__LOOP_INTERVAL_S="0.2")
    daemons = {
        name: start_cli("run", env=env, log_path=tmp_path / f"{name}.log") for name in ("a", "b")
    }
    try:
        first = wait_for_lease(store_dir, lambda lease: True, "a first leader")
        by_pid = {str(p.pid): name for name, p in daemons.items()}
        active = next(name for pid, name in by_pid.items() if f"-{pid}-" in first.owner)
        standby = "b" if active == "a" else "a"
        # Renewed well past its first expiry: the standby never got in meanwhile.
        renewed = wait_for_lease(
            store_dir,
            lambda lease: lease.expires_at_unix_ns >= first.expires_at_unix_ns + 2 * 10**9,
            "the leader to renew",
        )
        assert (renewed.owner, renewed.epoch) == (first.owner, first.epoch)
        assert "reconciler_standby" in (tmp_path / f"{standby}.log").read_text()

        os.kill(daemons[active].pid, signal.SIGKILL)
        daemons[active].wait()
        taken = wait_for_lease(
            store_dir,
            lambda lease: f"-{daemons[standby].pid}-" in lease.owner,
            "the standby to take over",
        )
        assert taken.epoch > first.epoch

        os.kill(daemons[standby].pid, signal.SIGTERM)
        assert daemons[standby].wait(timeout=DEADLINE_S) == 0
        released = lease_on_disk(store_dir)
        assert released is not None and released.expires_at_unix_ns <= time.time_ns()
    finally:
        for process in daemons.values():
            if process.poll() is None:
                process.kill()
            process.wait()


async def test_audit_command_reads_an_inventory(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    batches = now_batches(store_dir, agents=2, per_agent=3)
    store = FileSystemStore(store_dir)
    write_csv_inventory(tmp_path / "inventory", await store_rows(store, prefix=""), parts=1)

    result = run_cli(
        "audit", "--inventory", f"file://{tmp_path / 'inventory'}", env=cli_env(store_dir)
    )

    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert (record["status"], record["source"], record["manifests_seen"]) == (
        "completed",
        "inventory",
        6,
    )
    assert record["cataloged"] == 6
    assert await catalog_keys(store) == {b.key for b in batches}


def test_gc_dry_run_command_reports_and_changes_nothing(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    orphan = store_dir / keys.raw_blob_key("ab" * 32)
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"orphan frame bytes")
    before = sorted(p.relative_to(store_dir) for p in store_dir.rglob("*") if p.is_file())
    result = run_cli("gc", "--dry-run", env=cli_env(store_dir))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["record"]["dry_run"] is True and report["deleted"] == []
    after = sorted(
        p.relative_to(store_dir)
        for p in store_dir.rglob("*")
        if p.is_file()
        and not str(p.relative_to(store_dir)).startswith((".lm-store", "reconciler/v1/lease"))
    )
    assert after == before


def test_one_shot_command_exits_3_while_another_reconciler_is_active(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    lease = LeaseRecord(
        owner="someone-else", epoch=4, expires_at_unix_ns=time.time_ns() + 3600 * 10**9
    )
    (store_dir / keys.RECONCILER_LEASE_KEY).parent.mkdir(parents=True)
    (store_dir / keys.RECONCILER_LEASE_KEY).write_bytes(lease.to_json())

    result = run_cli("audit", env=cli_env(store_dir, LM_RECONCILER__LEASE_TTL_S="0.2"))

    assert result.returncode == 3
    assert "someone-else" in result.stderr


def test_a_phantom_row_is_listed_with_what_to_do_and_retract_closes_it(tmp_path: Path) -> None:
    from index.catalog import CatalogWriter
    from index.rows import accepted_row

    store_dir = tmp_path / "store"
    [held] = now_batches(store_dir, agents=1, per_agent=1)
    never = make_batch(9, 0, time.time_ns() - 2 * 3600 * keys.NS_PER_S)  # no manifest

    async def plant() -> None:
        store = FileSystemStore(store_dir)
        writer = CatalogWriter(store=store, clock=SystemClock(), rng=random.Random(1), epoch=0)
        row = accepted_row(never.manifest, etag='"0abc"')
        await writer.write(row.hour, [row], writer="steady")
        await store.close()

    asyncio.run(plant())
    env = cli_env(store_dir)
    assert run_cli("audit", env=env).returncode == 0

    listed = run_cli("problems", "--kind", "phantom-row", "--json", env=env)
    [problem] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert problem["subject_key"] == never.key and "retract" in problem["what_to_do"]
    assert "what to do:" in run_cli("problems", "--kind", "phantom-row", env=env).stdout

    refused = run_cli("retract", held.key, "--reason", "x", env=env)
    assert refused.returncode == 1 and "holds" in refused.stderr
    assert run_cli("retract", "accepted/v1/nonsense", "--reason", "x", env=env).returncode == 2

    done = run_cli("retract", never.key, "--reason", "bug 12", "--by", "ops", env=env)
    assert done.returncode == 0, done.stderr
    retraction = json.loads(done.stdout)
    assert (retraction["key"], retraction["by"], retraction["created"]) == (never.key, "ops", True)
    assert run_cli("problems", "--kind", "phantom-row", "--json", env=env).stdout == ""
