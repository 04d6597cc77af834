"""Real collectors accept a real fleet (with duplicates and identity conflicts) into an fs
store; derived entries are deleted by hand; ``lm-reconciler run --once`` restores them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.fleet import RunOptions, SpoolSettings, run_fleet
from agent.load import LoadSpec
from collector.launch import CollectorProcess, start_collector
from protocol import keys
from store.fs import FileSystemStore
from tests.reconciler.conftest import cli_env, derived_keys_in, keys_under, run_cli


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[CollectorProcess]:
    process = start_collector(
        work_dir=tmp_path / "logs",
        name="collector-1",
        env={
            "LM_STORE__URL": f"file://{tmp_path / 'store'}",
            "LM_INGEST__COLLECTOR_ID": "e2e-collector",
        },
    )
    try:
        yield process
    finally:
        process.stop()


async def test_run_once_restores_what_was_deleted_from_a_real_ingest(
    tmp_path: Path, collector: CollectorProcess
) -> None:
    spec = LoadSpec(
        agents=3,
        batches=8,
        points_per_batch=20,
        duplicate_rate=0.2,
        conflict_rate=0.15,
        seed=11,
        start_ns=time.time_ns(),
    )
    result = await run_fleet(
        urls=[collector.url],
        token=None,
        spool=SpoolSettings(directory=tmp_path / "spool", fsync=False),
        spec=spec,
        options=RunOptions(max_rounds=2, round_delay_s=0.1),
    )
    assert collector.stop() == 0  # SIGTERM flushes the derived-entry queue
    assert len(result.truth.accepted) == 24

    store = FileSystemStore(tmp_path / "store")
    written = await derived_keys_in(store)
    quarantined = await keys_under(store, keys.QUARANTINE_PREFIX)
    assert quarantined, "the fleet's conflicts should have been quarantined"
    deleted = sorted(written)[::3]  # every third entry, of every kind
    for key in deleted:
        await store.delete(key)

    env = cli_env(tmp_path / "store")
    once = run_cli("run", "--once", env=env)
    assert once.returncode == 0, once.stderr

    restored = await derived_keys_in(store)
    assert written <= restored
    # Only a raw-blobs-by-time entry may be new: the reconciler files a blob under its
    # record's hour, the collector under the hour it created the blob (they differ only
    # when an hour boundary fell in between).
    assert all(k.startswith(keys.RAW_BLOBS_BY_TIME_PREFIX) for k in restored - written)
    report = json.loads(once.stdout)
    assert sum(
        report["audit"]["repaired"].get(k, 0)
        for k in ("accepted-by-time", "accepted-by-blob", "raw-blobs-by-time", "quarantine-by-blob")
    ) + sum(report["steady"]["repaired"].values()) >= len(deleted)
    status = json.loads(run_cli("status", "--json", env=env).stdout)
    assert status["lag_hours"] == 0 and status["problems"]["total"] == 0
    assert status["last_completed_audit"]["manifests_seen"] == 24
    assert status["last_completed_audit"]["quarantines_seen"] == len(quarantined)
    await store.close()
