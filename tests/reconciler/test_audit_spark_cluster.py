"""The audit's Spark engine on a real standalone cluster (issue 23 item 3): a master and two
workers (separate JVMs, `tests.rollup.spark_cluster`), the project shipped as the built
audit zip through ``--py-files`` (``python -m rollup.job.pyfiles --audit``), the store on
MiniStack (S3 is all the executors share with the driver). ``spark-submit`` runs
``audit_spark_entry.py`` (= ``lm-reconciler audit --engine spark``) over one copy of a
world (`tests.reconciler.audit_world`), the local engine audits another in this process,
and both complete with the same outcome: the records cataloged (missing ones, the wrong
hash superseded: a catalog-mismatch; a retracted phantom's retracted row), the orphan
file, the ``missing-blob``, ``phantom-row`` and ``unreadable-index-file`` problems."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from config import Settings
from config.loader import load_settings
from protocol.clock import SystemClock
from protocol.records import AuditRecord
from reconciler.audit.records import latest_audit
from reconciler.audit.run import run_full_audit
from reconciler.context import open_context
from rollup.job.pyfiles import build_pyfiles
from store.open import open_store
from tests.reconciler.audit_world import World, audit_outcome, build_world
from tests.rollup.spark_cluster import StandaloneCluster, spark_submit, start_cluster
from tests.s3_servers import TEST_REGION, RunningServer


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()


def config_text(url: str, endpoint: str) -> str:
    """Both engines' settings; a retry horizon of a millisecond, so the orphan (seconds old by the store's clock) counts."""
    return (
        f'[store]\nurl = "{url}"\nendpoint_url = "{endpoint}"\nregion = "{TEST_REGION}"\n\n'
        "[reconciler]\nlease_ttl_s = 60.0\naudit_list_concurrency = 2\n\n"
        "[gc]\nretry_horizon_s = 0.001\n\n"
        '[logging]\nformat = "json"\n'
    )


async def seed_and_maybe_audit(
    url: str, settings: Settings, *, audit: bool
) -> tuple[World, dict[str, Any] | None]:
    """Build the world under ``url``; with ``audit``, run the local engine on it too."""
    store = open_store(url, endpoint_url=settings.store.endpoint_url, region=TEST_REGION)
    try:
        ctx = await open_context(
            store, settings=settings, clock=SystemClock(), rng=random.Random(1), owner="test"
        )
        try:
            world = await build_world(store, ctx)
            outcome = None
            if audit:
                record = await run_full_audit(ctx)
                assert record.status == "completed" and record.engine == "local"
                outcome = await audit_outcome(store, record)
        finally:
            await ctx.fence.release()  # the engine under spark-submit takes the lease
        return world, outcome
    finally:
        await store.close()


async def spark_outcome(url: str, endpoint: str) -> tuple[AuditRecord, dict[str, Any]]:
    store = open_store(url, endpoint_url=endpoint, region=TEST_REGION)
    try:
        record = await latest_audit(store)
        assert record is not None
        return record, await audit_outcome(store, record)
    finally:
        await store.close()


@pytest.mark.s3
@pytest.mark.slow  # ~1-2 min
def test_the_spark_engine_completes_the_audit_on_the_cluster_as_the_local_engine_does(
    spark_cluster: StandaloneCluster,
    ministack_server: RunningServer,
    ministack_bucket: str,
    tmp_path: Path,
) -> None:
    endpoint = ministack_server.endpoint_url
    spark_url, local_url = f"s3://{ministack_bucket}/spark", f"s3://{ministack_bucket}/local"
    config = tmp_path / "reconciler.toml"
    config.write_text(config_text(spark_url, endpoint))
    local_config = tmp_path / "local.toml"
    local_config.write_text(config_text(local_url, endpoint))
    world, _ = asyncio.run(
        seed_and_maybe_audit(spark_url, load_settings(config, environ={}), audit=False)
    )
    _, want = asyncio.run(
        seed_and_maybe_audit(local_url, load_settings(local_config, environ={}), audit=True)
    )
    dist = tmp_path / "dist"
    built = build_pyfiles(dist, audit=True)
    completed = spark_submit(
        spark_cluster.master_url,
        tmp_path,
        [
            *("--py-files", str(built.zip_path)),
            *(str(built.entry_path), "--config", str(config)),
        ],
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    # Nothing configured the shuffle: the audit sized it, one partition per executor core.
    [shuffle] = [
        json.loads(x)
        for x in (completed.stdout + completed.stderr).splitlines()
        if '"audit_spark_shuffle"' in x
    ]
    assert (shuffle["rows_listed"], shuffle["partitions"]) == (18, 2), shuffle
    [line] = [x for x in completed.stdout.splitlines() if '"engine": "spark"' in x]
    printed = json.loads(line)
    assert printed["status"] == "completed"
    assert printed["keys_listed"] == {
        "accepted": 8,
        "quarantine": 1,
        "raw-blobs": 9,
        "raw-bundles": 0,
    }

    record, got = asyncio.run(spark_outcome(spark_url, endpoint))
    assert record.audit_id == printed["audit_id"] and record.engine == "spark"
    assert got == want
    assert [kind for kind, _subject in got["problems"]] == [
        "missing-blob",
        "missing-blob",
        "missing-blob",  # the retracted phantom's blob (its rows still reference it)
        "phantom-row",
        "unreadable-index-file",
    ]
    assert got["rows"][world.retracted.key][0] == "retracted"  # written on the cluster too
    assert world.orphan_sha in got["orphans"] and len(got["orphans"]) == 1
    assert got["rows"][world.wrong_hash.key][1] == world.wrong_hash.sha
    # It ran on the cluster, as one application.
    state = spark_cluster.state()
    assert [app["name"] for app in state["completedapps"]] == ["lm-reconciler-audit"]
