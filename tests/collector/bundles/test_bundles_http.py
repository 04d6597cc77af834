"""Group commit over real HTTP (PROTOCOL §3.10): 64 concurrent batch POSTs on one
collector take fewer raw PUTs than frames, and every 200 has its manifest, naming the
raw object and, for a bundle, a range whose bytes are the frame."""

from __future__ import annotations

import asyncio

import aiohttp

from collector.bundles.bundler import BundleLimits
from collector.bundles.options import BundleOptions
from protocol import keys, records
from protocol.bundle import read_frame
from store.memory import MemoryStore
from tests.collector.bundles.harness import frame_sha
from tests.collector.conftest import make_frame, manifest_key_of, post_frame
from tests.collector.inprocess import WRITER_TOKEN, in_process_collector

SENDERS = 64


class SlowRawPuts(MemoryStore):
    """A raw object's PUT takes 20 ms (an object store's latency, scaled down); the raw
    PUTs are counted."""

    def __init__(self, delay_s: float = 0.02) -> None:
        super().__init__()
        self.delay_s = delay_s
        self.raw_puts: list[str] = []

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        if key.startswith((keys.RAW_BLOBS_PREFIX, keys.RAW_BUNDLES_PREFIX)):
            self.raw_puts.append(key)
            await asyncio.sleep(self.delay_s)
        return await super().put(key, body, if_none_match=if_none_match, if_match=if_match)


async def post_all(base_url: str, frames: list[bytes]) -> list[int]:
    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(
            *(post_frame(session, base_url, frame, token=WRITER_TOKEN) for frame in frames)
        )
    return [answer.status for answer in answers]


async def test_concurrent_posts_share_bundles_and_every_200_names_its_bytes() -> None:
    memory = SlowRawPuts()
    frames = [make_frame(f"agent-{i}", seq_start=1) for i in range(SENDERS)]
    options = BundleOptions(limits=BundleLimits(send_margin_s=1.0), enabled=lambda: True)
    async with in_process_collector(bundles=options, memory=memory, budget_s=10.0) as collector:
        statuses = await post_all(collector.base_url, frames)
    assert statuses == [200] * SENDERS
    assert len(memory.raw_puts) < SENDERS, memory.raw_puts
    bundled = 0
    for i, frame in enumerate(frames):
        body, _etag = await memory.get(manifest_key_of(f"agent-{i}", 1))
        manifest = records.AcceptedManifest.from_json(body, reads_bundles=True)
        assert manifest.frame_sha256 == frame_sha(frame)
        raw, _etag = await memory.get(manifest.raw_blob_key)
        if manifest.raw_range is None:
            assert raw == frame
            continue
        bundled += 1
        offset, length = manifest.raw_range
        got = read_frame(
            raw, offset, length, frame_sha256=manifest.frame_sha256, max_frame_bytes=1 << 20
        )
        assert bytes(got) == frame
    assert bundled > 0


async def test_with_the_gate_off_concurrent_posts_take_one_raw_put_each() -> None:
    memory = SlowRawPuts()
    frames = [make_frame(f"agent-{i}", seq_start=1) for i in range(8)]
    options = BundleOptions(limits=BundleLimits(send_margin_s=1.0))  # the gate says no
    async with in_process_collector(bundles=options, memory=memory) as collector:
        statuses = await post_all(collector.base_url, frames)
    assert statuses == [200] * 8
    assert sorted(memory.raw_puts) == sorted(keys.raw_blob_key(frame_sha(f)) for f in frames)


async def test_while_a_full_bundle_waits_for_the_slot_new_batches_get_429() -> None:
    memory = SlowRawPuts(delay_s=0.2)
    frames = [make_frame(f"agent-{i}", seq_start=1) for i in range(8)]
    limits = BundleLimits(max_in_flight=1, max_frames=2, send_margin_s=1.0)
    options = BundleOptions(limits=limits, enabled=lambda: True)
    async with in_process_collector(bundles=options, memory=memory, budget_s=10.0) as collector:
        async with aiohttp.ClientSession() as session:
            answers = await asyncio.gather(
                *(post_frame(session, collector.base_url, f, token=WRITER_TOKEN) for f in frames)
            )
    refused = [a for a in answers if a.status == 429]
    assert refused and all(a.json["error"] == "overloaded" for a in refused)
    assert all(a.headers.get("Retry-After") for a in refused)
    for i, answer in enumerate(answers):
        if answer.status == 200:
            await memory.get(manifest_key_of(f"agent-{i}", 1))
        else:
            assert answer.status == 429
