"""Mixed stores and versions on a real S3 server (issue 33 item 7, PROTOCOL §3.10): one
MiniStack bucket goes from frame blobs to frame blobs and bundles side by side.

1. Bundles off (no feature record): a collector with ``[ingest] bundle = false`` accepts
   batches as frame blobs.
2. An old reader is registered (its version entry says ``reads_bundles: false``, not
   expired): ``enable-bundles`` refuses, naming it. Once its entry expired (the injected
   clock moves past it) the command writes the feature record.
3. A collector with ``bundle = true`` (started after the gate turned on, so it reads the
   record at start) and the ``bundle = false`` one accept concurrent batches into the
   same bucket: bundles and frame blobs in one store.
4. The reconciler's steady pass and full audit find no problem, the rollup (the session's
   local Spark) reads both kinds, ``verify`` agrees, and every acknowledged batch is in
   ``rollup_1m`` exactly once (the totals equal the frames sent, recomputed without the
   job).

Real ``lm-collector serve`` processes over HTTP on 127.0.0.1, stopped by PID; the
reconciler and the rollup run in process on the same bucket.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import pytest

from chaos.s3_server import RunningServer, fresh_bucket
from config import GcSettings, ReconcilerSettings, Settings
from index.raw_reads import RawRef, read_frame
from index.versions import ENTRY_TTL_S
from protocol import keys, records
from protocol.clock import ManualClock, SystemClock
from reconciler.audit.run import run_full_audit
from reconciler.context import open_context
from reconciler.features_cmd import enable_bundles
from reconciler.problems import list_problems
from reconciler.steady import SteadyScanner
from rollup.job.run import run_rollup
from rollup.read.verify import verify
from rollup.table.storage import StoreAccess
from store.base import ObjectStore
from store.errors import NotFound
from store.open import open_store
from tests.collector.conftest import CollectorLauncher, post_frame, write_tokens_file
from tests.rollup.conftest import (
    DATA_START_NS,
    SentFrame,
    assert_rollup_equal,
    committed_rollup,
    expected_rollup,
    make_frame,
    settings,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.s3

BEFORE = 6  # frame blobs written while bundles are off
BUNDLED = 48  # concurrent batches to the collector with bundle = true
PLAIN = 12  # concurrent batches to the collector with bundle = false, at the same time
OLD_READER = keys.version_entry_key("rollup-job", "old-host-1234-abcdef")


def frames(agent: str, count: int) -> list[SentFrame]:
    return [
        make_frame(
            [(DATA_START_NS + (n * 10 + i) * 1_000_000_000, "mixed.load", float(n), {"a": agent})
             for i in range(5)],
            agent_id=agent,
            seq_start=n * 5,
        )
        for n in range(count)
    ]  # fmt: skip


async def send(
    base_url: str, token: str, batches: list[SentFrame], session: aiohttp.ClientSession
) -> list[int]:
    answers = await asyncio.gather(
        *(post_frame(session, base_url, sent.frame, token=token) for sent in batches)
    )
    return [a.status for a in answers]


async def raw_keys(store: ObjectStore, prefix: str) -> set[str]:
    return {info.key async for info in store.list(prefix)}


async def test_frame_blobs_and_bundles_in_one_store_from_collectors_of_both_settings(
    spark: SparkSession,
    ministack_server: RunningServer,
    tmp_path: Path,
) -> None:
    endpoint = ministack_server.endpoint_url
    url = f"s3://{fresh_bucket(ministack_server)}/mixed"
    store = open_store(url, endpoint_url=endpoint)
    launcher = CollectorLauncher(tmp_path / "collectors")
    tokens = write_tokens_file(tmp_path / "tokens.toml")
    env = {"LM_STORE__ENDPOINT_URL": endpoint, "LM_METRICS__ENABLED": "false"}
    sent: list[SentFrame] = []
    try:
        plain = launcher.start(
            store_url=url, name="plain", tokens=tokens, env={**env, "LM_INGEST__BUNDLE": "false"}
        )
        # 1. Bundles off: frame blobs only.
        before = frames("agent-before", BEFORE)
        async with aiohttp.ClientSession() as session:
            assert await send(plain.base_url, tokens.writer, before, session) == [200] * BEFORE
        sent += before
        assert await raw_keys(store, keys.RAW_BUNDLES_PREFIX) == set()
        assert len(await raw_keys(store, keys.RAW_BLOBS_PREFIX)) == BEFORE

        # 2. The gate refuses while an old reader's entry is unexpired, then turns on.
        clock = ManualClock(time.time_ns())
        old = records.VersionEntry(
            version="0.9.0",
            reads_bundles=False,
            expires_at_unix_ns=clock.now_ns() + int(ENTRY_TTL_S * 1e9) // 10,
        )
        await store.put(OLD_READER, old.to_json())
        refused = await enable_bundles(store, clock, Settings(), by="test", dry_run=False)
        assert not refused.bundles and not refused.written
        assert any(OLD_READER in b and "does not read bundles" in b for b in refused.blocking)
        with pytest.raises(NotFound):  # nothing written while it blocks
            await store.get(keys.INDEX_FEATURES_KEY)
        # Past its expiry (a tenth of the TTL) but within the running collector's own.
        clock.advance(ENTRY_TTL_S / 5)
        enabled = await enable_bundles(store, clock, Settings(), by="test", dry_run=False)
        assert enabled.bundles and enabled.written, enabled.blocking

        # 3. Both settings at once, into the same bucket.
        bundling = launcher.start(
            store_url=url,
            name="bundling",
            tokens=tokens,
            env={**env, "LM_INGEST__BUNDLE_MAX_IN_FLIGHT": "1"},  # frames wait: bundles form
        )
        bundled, unbundled = frames("agent-bundled", BUNDLED), frames("agent-plain", PLAIN)
        async with aiohttp.ClientSession() as session:
            got_bundled, got_plain = await asyncio.gather(
                send(bundling.base_url, tokens.writer, bundled, session),
                send(plain.base_url, tokens.writer, unbundled, session),
            )
        assert got_bundled == [200] * BUNDLED and got_plain == [200] * PLAIN
        sent += bundled + unbundled
        launcher.stop_all()  # SIGTERM: the index log buffers are flushed

        bundle_keys = await raw_keys(store, keys.RAW_BUNDLES_PREFIX)
        blob_keys = await raw_keys(store, keys.RAW_BLOBS_PREFIX)
        assert bundle_keys and blob_keys  # both kinds in one store
        named_bundles = 0
        for frame in sent:
            body, _ = await store.get(frame.manifest.manifest_key)
            manifest = records.AcceptedManifest.from_json(body, reads_bundles=True)
            assert manifest.frame_sha256 == frame.sha256
            assert manifest.raw_blob_key in bundle_keys | blob_keys
            if manifest.raw_range is not None:
                named_bundles += 1
                assert manifest.raw_blob_key in bundle_keys
                assert frame.manifest.identity.agent_id == "agent-bundled"  # never bundle = false
            ref = RawRef.of_manifest(manifest)
            assert await read_frame(store, ref, max_frame_bytes=1 << 23) == frame.frame
        assert 0 < named_bundles <= BUNDLED
        assert len(bundle_keys) < named_bundles  # bundles shared among frames

        # 4. The reconciler, the rollup and verify over both kinds.
        ctx = await open_context(
            store,
            settings=Settings(
                reconciler=ReconcilerSettings(lease_ttl_s=60.0, verify_rate_per_s=1000.0),
                gc=GcSettings(enabled=False),
            ),
            clock=SystemClock(),
            rng=random.Random(33),
            owner="reconciler-mixed",
        )
        try:
            await SteadyScanner(ctx).run_pass()
            audit = await run_full_audit(ctx)
        finally:
            await ctx.fence.release()
        assert audit.status == "completed"
        assert [r async for _key, r in list_problems(store)] == []
        summary = await run_rollup(
            spark, store, access=StoreAccess(url, endpoint_url=endpoint), settings=settings()
        )
        assert summary.outcome == "committed" and not summary.problems, summary
        assert summary.batches == len(sent)
        assert summary.points == 5 * len(sent)
        assert_rollup_equal(await committed_rollup(store, endpoint), expected_rollup(sent))
        assert (await verify(store)).ok
    finally:
        launcher.stop_all()
        await store.close()
