"""A real ``lm-collector serve`` on a store whose feature record says ``bundles: true``
(PROTOCOL §3.10): concurrent batches share bundles, every 200 has its manifest naming
its raw object and range, and the collector reports frames per raw PUT."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from protocol import keys, records
from protocol.bundle import read_frame
from store.fs import FileSystemStore
from tests.collector.bundles.harness import frame_sha
from tests.collector.conftest import (
    CollectorLauncher,
    get,
    make_frame,
    manifest_key_of,
    metric_value,
    post_frame,
    write_tokens_file,
)

SENDERS = 64


async def test_a_collector_on_a_store_with_bundles_on_writes_bundles(
    tmp_path: Path, collectors: CollectorLauncher
) -> None:
    store = FileSystemStore(tmp_path / "store")
    feature = records.FeatureRecord(bundles=True, written_by="test", written_at_unix_ns=1)
    await store.put(keys.INDEX_FEATURES_KEY, feature.to_json())
    tokens = write_tokens_file(tmp_path / "tokens.toml")
    collector = collectors.start(
        store_url=f"file://{tmp_path / 'store'}",
        tokens=tokens,
        env={"LM_INGEST__BUNDLE_MAX_IN_FLIGHT": "1"},  # one raw write at a time: frames wait
    )
    frames = [make_frame(f"agent-{i}", seq_start=1) for i in range(SENDERS)]
    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(
            *(post_frame(session, collector.base_url, f, token=tokens.writer) for f in frames)
        )
        assert [a.status for a in answers] == [200] * SENDERS
        metrics = (await get(session, f"{collector.base_url}/metrics")).text
    puts = metric_value(metrics, "lm_collector_frames_per_raw_put_count")
    assert puts is not None and 1 <= puts < SENDERS
    assert metric_value(metrics, "lm_collector_frames_per_raw_put_sum") == SENDERS
    bundled = 0
    for i, frame in enumerate(frames):
        body, _etag = await store.get(manifest_key_of(f"agent-{i}", 1))
        manifest = records.AcceptedManifest.from_json(body, reads_bundles=True)
        raw, _etag = await store.get(manifest.raw_blob_key)
        if manifest.raw_range is None:
            assert raw == frame
            continue
        bundled += 1
        got = read_frame(
            raw, *manifest.raw_range, frame_sha256=frame_sha(frame), max_frame_bytes=1 << 23
        )
        assert bytes(got) == frame
    assert bundled > 0
    await store.close()
