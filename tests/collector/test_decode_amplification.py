"""Issue 24 item 8: a dictionary-encoded metric decodes to up to 256 bytes a row, so a
small valid frame can decode to many times its size. Intake refuses a frame whose decoded
points would exceed ``max_raw_bytes`` (400 ``invalid_frame``), and the live window charges
every decode to its memory account before it allocates (the own batches and the
designated follower alike)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pyarrow as pa
import pytest
import zstandard

from collector.query.sources import LogFollower, OwnBatches
from collector.query.window import LiveWindow
from index.log_writer import IndexLogWriter
from index.rows import accepted_row
from protocol import frame as fr
from protocol import frame_encode as fe
from protocol.clock import ManualClock
from protocol.records import AcceptedManifest
from store.fs import FileSystemStore
from tests.collector.conftest import post_frame, store_keys
from tests.collector.inprocess import LIMITS, WRITER_TOKEN, in_process_collector
from tests.protocol import frame_vectors as vectors

NS = 1_000_000_000
NOW = 1_795_000_000 * NS


def bomb_frame(rows: int, *, agent_id: str = "agent-bomb", seq_start: int = 0) -> bytes:
    """A dictionary-encoded metric of one 256-byte value, ``rows`` rows, no labels."""
    table = pa.table(
        {
            "ts": pa.array([NOW] * rows, pa.int64()).cast(vectors.TS),
            "metric": pa.DictionaryArray.from_arrays(
                pa.array([0] * rows, pa.int8()), pa.array(["m" * fr.MAX_METRIC_BYTES])
            ),
            "value": pa.array([0.0] * rows),
            "labels": pa.nulls(rows, vectors.LABELS),
        }
    )
    raw = vectors.spec_stream(table)
    return vectors.spec_frame(
        payload=zstandard.ZstdCompressor(level=19).compress(raw),
        agent_id=agent_id.encode(),
        boot_id=uuid.UUID(int=7).bytes,
        seq_start=seq_start,
        flags=0x01,
        payload_raw_len=len(raw),
        record_count=rows,
    )


def small_frame(seq_start: int, rows: int = 10, agent_id: str = "agent-a") -> bytes:
    table = fe.points_table(
        [NOW + i for i in range(rows)], ["cpu"] * rows, [1.0] * rows, [{"host": "a"}] * rows
    )
    return fe.encode_frame(
        agent_id=agent_id, boot_id=uuid.UUID(int=8), seq_start=seq_start, points=table
    )


def manifest_of(body: bytes, accepted_ns: int = NOW) -> AcceptedManifest:
    return AcceptedManifest.of_frame(body, accepted_at_unix_ns=accepted_ns, collector_id="c1")


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as opened:
        yield opened


# --- intake ---------------------------------------------------------------------------


async def test_a_frame_decoding_past_max_raw_bytes_is_refused_at_intake(
    session: aiohttp.ClientSession,
) -> None:
    rows = 5_000
    bomb = bomb_frame(rows)
    header = fr.decode_header(bomb)
    # Within every limit the old intake checked, on the wire and decompressed...
    assert len(bomb) < 2048 and header.payload_raw_len < LIMITS.max_raw_bytes
    assert rows * fr.MAX_METRIC_BYTES > LIMITS.max_raw_bytes  # ...but not decoded.
    normal = vectors.spec_frame(
        payload=vectors.spec_stream(vectors.dictionary_metric_table()),
        agent_id=b"agent-dict",
        record_count=3,
    )

    async with in_process_collector() as collector:
        refused = await post_frame(session, collector.base_url, bomb, token=WRITER_TOKEN)
        assert await store_keys(collector.memory) == []  # bad input changes nothing
        accepted = await post_frame(session, collector.base_url, normal, token=WRITER_TOKEN)

    assert refused.status == 400, refused
    assert refused.json["error"] == "invalid_frame"
    detail = refused.json["detail"]
    assert "metric dictionary expanded per row" in detail
    assert f"> max_raw_bytes {LIMITS.max_raw_bytes}" in detail
    assert accepted.status == 200 and accepted.json["duplicate"] is False, accepted


# --- the live window's memory account -----------------------------------------------------


def test_the_window_evicts_the_oldest_beyond_its_bytes_and_refuses_what_cannot_fit() -> None:
    frames = [fr.decode_frame(small_frame(seq * 10)) for seq in range(4)]
    size = frames[0].points.get_total_buffer_size()
    window = LiveWindow(window_s=3600, max_points=1000, max_bytes=3 * size)
    for index, frame in enumerate(frames):
        assert window.add(f"m{index}", NOW + index, frame, now_ns=NOW)
        assert window.byte_count <= window.max_bytes
    assert [b.manifest_id for b in window.batches()] == ["m1", "m2", "m3"]  # m0 evicted

    # A decode reserves before it allocates: older batches make room for it...
    assert window.reserve(2 * size)
    assert [b.manifest_id for b in window.batches()] == ["m3"]
    # ...but decodes in progress are never evicted: no room left for one more.
    assert not window.reserve(2 * size)
    assert window.byte_count == 3 * size
    window.release(2 * size)
    assert window.byte_count == size
    assert {d.manifest_id for d in window.dropped()} == {"m0", "m1", "m2"}


async def test_own_batches_charge_decoding_and_lose_what_the_account_cannot_hold() -> None:
    held = small_frame(0)
    bomb = bomb_frame(2_000, agent_id="agent-a", seq_start=100)
    limit = 1 << 20  # the bomb is valid: it decodes to ~0.6 MB, within max_raw_bytes
    opened = fr.open_payload(bomb, fr.decode_header(bomb), max_raw_bytes=limit)
    assert opened.decoded_bytes > 2_000 * fr.MAX_METRIC_BYTES
    budget = opened.decoded_bytes // 2  # the window's account: below the bomb's points
    assert budget > fr.decode_header(bomb).payload_raw_len
    window = LiveWindow(window_s=3600, max_points=1_000_000, max_bytes=budget)
    own = OwnBatches(window, clock=ManualClock(NOW), max_raw_bytes=limit)

    for body in (held, bomb):
        own.on_accepted(manifest_of(body), body)
        await asyncio.gather(*list(own._tasks))

    assert window.byte_count <= budget
    assert [b.manifest_id for b in window.batches()] == [manifest_of(held).identity.manifest_id]
    assert [d.manifest_id for d in window.dropped()] == [manifest_of(bomb).identity.manifest_id]


async def test_the_follower_charges_decoding_to_the_window(tmp_path: Path) -> None:
    clock = ManualClock(NOW)
    store = FileSystemStore(tmp_path / "store", clock=clock)
    writer = IndexLogWriter(store=store, clock=clock, rng=random.Random(1), writer_id="c1")
    bodies = [small_frame(0), bomb_frame(2_000, agent_id="agent-a", seq_start=100)]
    for body in bodies:
        manifest = manifest_of(body, accepted_ns=clock.now_ns())
        await store.put(manifest.raw_blob_key, body)
        writer.append(accepted_row(manifest))
        clock.advance(1)
    await writer.flush()
    limit = 1 << 20
    bomb_header = fr.decode_header(bodies[1])
    budget = fr.open_payload(bodies[1], bomb_header, max_raw_bytes=limit).decoded_bytes // 2
    window = LiveWindow(window_s=3600, max_points=1_000_000, max_bytes=budget)
    follower = LogFollower(
        store, window, clock=clock, poll_interval_s=1, lookback_s=5, max_pending=100,
        max_raw_bytes=limit,
    )  # fmt: skip

    await follower.poll_once()

    assert window.byte_count <= budget
    assert [b.manifest_id for b in window.batches()] == [
        manifest_of(bodies[0]).identity.manifest_id
    ]
    assert [d.manifest_id for d in window.dropped()] == [
        manifest_of(bodies[1]).identity.manifest_id
    ]
