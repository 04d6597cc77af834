"""Real collectors accept a real fleet (with duplicates and identity conflicts) into an fs
store and log what they did; a log segment is lost; ``lm-reconciler run --once`` catalogs
what the log names and its audit catalogs exactly what the lost segment alone named."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.fleet import RunOptions, SpoolSettings, run_fleet
from agent.load import LoadSpec
from collector.launch import CollectorProcess, start_collector
from index.log_reader import read_segment
from protocol import keys
from store.fs import FileSystemStore
from tests.collector.conftest import wait_for_log_rows_named
from tests.reconciler.conftest import catalog_keys, cli_env, keys_under, run_cli


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[CollectorProcess]:
    process = start_collector(
        work_dir=tmp_path / "logs",
        name="collector-1",
        env={
            "LM_STORE__URL": f"file://{tmp_path / 'store'}",
            "LM_INGEST__COLLECTOR_ID": "e2e-collector",
            "LM_INGEST__INDEX_FLUSH_MAX_AGE_MS": "200",  # several segments in a short run
        },
    )
    try:
        yield process
    finally:
        process.stop()


async def test_run_once_catalogs_the_log_and_the_audit_what_a_lost_segment_named(
    tmp_path: Path, collector: CollectorProcess
) -> None:
    store = FileSystemStore(tmp_path / "store")
    spool = SpoolSettings(directory=tmp_path / "spool", fsync=False)
    options = RunOptions(max_rounds=2, round_delay_s=0.1)
    start_ns = time.time_ns()
    spec = LoadSpec(
        agents=3,
        batches=8,
        points_per_batch=20,
        duplicate_rate=0.2,
        conflict_rate=0.15,
        seed=11,
        start_ns=start_ns,
    )
    first = await run_fleet(
        urls=[collector.url], token=None, spool=spool, spec=spec, options=options
    )
    # The first fleet's rows are in the log before the second fleet sends: the records
    # then span at least two segments, whatever the machine's speed.
    first_records = await keys_under(store, keys.ACCEPTED_PREFIX) | await keys_under(
        store, keys.QUARANTINE_PREFIX
    )
    await wait_for_log_rows_named(store, *first_records)
    later = LoadSpec(
        agents=1, batches=4, points_per_batch=20, seed=12, start_ns=start_ns, agent_prefix="later"
    )
    second = await run_fleet(
        urls=[collector.url], token=None, spool=spool, spec=later, options=options
    )
    assert collector.stop() == 0  # SIGTERM flushes the index log buffer
    assert len(first.truth.accepted) == 24 and len(second.truth.accepted) == 4

    records = await keys_under(store, keys.ACCEPTED_PREFIX) | await keys_under(
        store, keys.QUARANTINE_PREFIX
    )
    quarantined = await keys_under(store, keys.QUARANTINE_PREFIX)
    assert quarantined, "the fleet's conflicts should have been quarantined"
    named: dict[str, set[str]] = {}
    for segment in sorted(await keys_under(store, keys.INDEX_LOG_PREFIX)):
        rows = await read_segment(store, segment)
        named[segment] = {row.key for row in rows if row.kind != "blob"}
    assert set().union(*named.values()) == records  # the collector logged every record
    assert len(named) >= 2

    # Lose the segment that alone named the most records, as if its rows had died with
    # their collector: only the audit can find those records now.
    def alone(segment: str) -> set[str]:
        others = set().union(*(found for name, found in named.items() if name != segment))
        return named[segment] - others

    lost_segment = max(named, key=lambda segment: len(alone(segment)))
    lost = alone(lost_segment)
    assert lost
    await store.delete(lost_segment)

    env = cli_env(tmp_path / "store")
    once = run_cli("run", "--once", env=env)
    assert once.returncode == 0, once.stderr

    report = json.loads(once.stdout)
    assert report["complete"]
    assert report["steady"]["rows_cataloged"] == len(records - lost)
    assert report["audit"]["status"] == "completed"
    assert report["audit"]["cataloged"] == len(lost)  # exactly what the log lost
    assert await catalog_keys(store) == records
    status = json.loads(run_cli("status", "--json", env=env).stdout)
    assert status["log"]["segments_behind"] == 0 and status["problems"]["total"] == 0
    assert status["last_completed_audit"]["manifests_seen"] == 28
    assert status["last_completed_audit"]["quarantines_seen"] == len(quarantined)
    assert status["index_requests_per_batch"] is not None
    await store.close()
