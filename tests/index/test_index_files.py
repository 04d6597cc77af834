"""The index's files: rows, log segments, catalog files, compaction, digests (memory store)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import random
import uuid

import numpy as np
import pyarrow.parquet as pq
import pytest

from chaos.catalog_rows import read_hour
from index import catalog, log_reader
from index.catalog_merge import merge_files
from index.digests import KeyDigestSet, ShaPrefixSet, digests_of, sha_prefixes
from index.log_writer import IndexLogWriter
from index.row_checks import decode
from index.rows import (
    SCHEMA,
    IndexFileError,
    IndexRow,
    accepted_row,
    blob_row,
    encode,
    quarantine_row,
    read_table,
    rows_of,
    table_of,
)
from protocol import keys
from protocol.clock import ManualClock, SystemClock
from protocol.records import AcceptedManifest, IdentityConflict
from store.errors import Unavailable
from store.memory import MemoryStore

T0 = 1_760_000_000_000_000_000  # 2025-10-09T08:53:20Z
HOUR_NS = 3600 * 10**9


def manifest(seq: int, at_ns: int = T0, agent: str = "agent-a") -> AcceptedManifest:
    frame = f"frame {agent} {seq}".encode()
    sha = hashlib.sha256(frame).hexdigest()
    return AcceptedManifest(
        agent_id=agent,
        boot_id=str(uuid.UUID(int=7)),
        seq_start=seq,
        seq_end=seq,
        record_count=1,
        frame_sha256=sha,
        frame_bytes=100,
        raw_blob_key=keys.raw_blob_key(sha),
        accepted_at_unix_ns=at_ns,
        collector_id="c1",
    )


def conflict(seq: int) -> IdentityConflict:
    accepted = manifest(seq)
    other = hashlib.sha256(b"other").hexdigest()
    return IdentityConflict(
        agent_id=accepted.agent_id,
        boot_id=accepted.boot_id,
        seq_start=seq,
        seq_end=seq,
        accepted_manifest_key=accepted.manifest_key,
        accepted_raw_blob_key=accepted.raw_blob_key,
        accepted_frame_sha256=accepted.frame_sha256,
        submitted_raw_blob_key=keys.raw_blob_key(other),
        submitted_frame_sha256=other,
        observed_at_unix_ns=T0 + 5,
        collector_id="c1",
    )


def test_rows_round_trip_through_parquet() -> None:
    rows = [accepted_row(manifest(1)), quarantine_row(conflict(1)), blob_row("ab" * 32, T0)]
    assert decode(encode(rows), source="t") == rows
    assert rows[1].referenced_raw_keys == (
        keys.raw_blob_key(conflict(1).submitted_frame_sha256),
        keys.raw_blob_key(manifest(1).frame_sha256),
    )


def test_a_row_whose_blob_key_does_not_match_its_hash_is_refused() -> None:
    bad = IndexRow(
        kind="accepted",
        key=manifest(1).manifest_key,
        frame_sha256="ab" * 32,
        time_unix_ns=T0,
        raw_blob_key=keys.raw_blob_key("cd" * 32),
        agent_id="a",
        boot_id=str(uuid.UUID(int=7)),
        seq_start=1,
        seq_end=1,
    )
    with pytest.raises(IndexFileError, match="raw_blob_key"):
        decode(encode([bad]), source="seg")
    with pytest.raises(IndexFileError, match="seg: not an index file"):
        decode(b"not parquet", source="seg")


def test_segment_names_sort_by_first_time_across_hours() -> None:
    early = keys.index_log_segment_key(T0 + HOUR_NS - 1, "c-1", 5)
    late = keys.index_log_segment_key(T0 + HOUR_NS + 1, "a", 1)
    assert early < late
    assert keys.index_log_start_after(T0 + HOUR_NS) < late
    assert keys.index_log_start_after(T0 + HOUR_NS) > early
    assert keys.index_log_start_after(T0 + HOUR_NS + 2) > late
    name = keys.parse_index_log_segment_key(late)
    assert (name.time_ns, name.writer_id, name.random) == (T0 + HOUR_NS + 1, "a", 1)
    assert keys.index_writer_id("host:1/x") == "host_1_x"


async def test_log_writer_cuts_one_segment_named_by_its_cut_time_and_a_reader_resumes() -> None:
    clock = ManualClock(T0 + 2 * HOUR_NS)
    store = MemoryStore(clock=clock)
    writer = IndexLogWriter(store=store, clock=clock, rng=random.Random(1), writer_id="c1")
    for seq, at in enumerate([T0, T0 + 1, T0 + HOUR_NS]):  # rows of two earlier hours
        assert writer.append(accepted_row(manifest(seq, at)))
    await writer.flush()
    assert writer.stats.segments_written == 1 and writer.buffered == 0
    position = log_reader.LogPosition()
    seen = [info.key async for info, _ in log_reader.new_segments(store, position, lookback_s=60)]
    assert len(seen) == 1
    name = keys.parse_index_log_segment_key(seen[0])
    assert name.time_ns == T0 + 2 * HOUR_NS  # the cut time, never a row's record time
    assert name.hour == keys.UtcHour.from_unix_ns(T0 + 2 * HOUR_NS)
    rows = await log_reader.read_segment(store, seen[0])
    assert [row.seq_start for row in rows] == [0, 1, 2]
    position.consumed(seen[0], name.time_ns, 60 * 10**9)
    clock.advance(1)
    writer.append(accepted_row(manifest(9, T0 + HOUR_NS + 10)))
    await writer.flush()
    fresh = [info.key async for info, _ in log_reader.new_segments(store, position, lookback_s=60)]
    assert len(fresh) == 1 and fresh[0] not in seen


async def test_a_segment_create_is_not_sent_past_its_budget_and_its_rows_are_cut_again() -> None:
    clock = ManualClock(T0)
    store = MemoryStore(clock=clock)
    writer = IndexLogWriter(
        store=store,
        clock=clock,
        rng=random.Random(1),
        writer_id="c1",
        put_budget_s=60.0,
        landing_s=35.0,  # sends only within 25 s of the cut
    )
    writer.append(accepted_row(manifest(1)))
    sent: list[float] = []

    async def slow_failure(*_args: object, **_kwargs: object) -> str:
        sent.append(clock.monotonic())
        clock.advance(20.0)  # each attempt times out after 20 s
        raise Unavailable("put", "k", "timed out")

    real_put = store.put
    store.put = slow_failure  # type: ignore[method-assign]
    await writer.flush()
    assert len(sent) == 2 and sent[-1] <= 25.0  # a third would be sent 40 s after the cut
    assert writer.buffered == 1 and writer.stats.flush_failures == 1
    store.put = real_put  # type: ignore[method-assign]
    await writer.flush()
    [segment] = [info.key async for info in store.list(keys.INDEX_LOG_PREFIX)]
    assert keys.parse_index_log_segment_key(segment).time_ns == clock.now_ns()  # cut anew


async def test_a_writer_whose_clock_is_skewed_cuts_no_segment_and_keeps_its_rows() -> None:
    clock = ManualClock(T0)
    store = MemoryStore(clock=clock)
    skewed = [True]
    events: dict[str, int] = {}
    writer = IndexLogWriter(
        store=store,
        clock=clock,
        rng=random.Random(1),
        writer_id="c1",
        skewed=lambda: skewed[0],
        on_event=lambda fate, n: events.__setitem__(fate, events.get(fate, 0) + n),
    )
    writer.append(accepted_row(manifest(1)))
    await writer.flush()
    assert [info async for info in store.list(keys.INDEX_LOG_PREFIX)] == []
    assert writer.buffered == 1 and writer.stats.held_skewed == 1
    assert events == {"held_skewed": 1}
    skewed[0] = False
    await writer.flush()
    assert writer.buffered == 0 and writer.stats.segments_written == 1


async def test_log_writer_bounds_its_buffer_and_keeps_rows_through_a_failed_flush() -> None:
    clock = ManualClock(T0)
    store = MemoryStore(clock=clock)
    writer = IndexLogWriter(
        store=store,
        clock=clock,
        rng=random.Random(1),
        writer_id="c1",
        flush_rows=2,
        max_buffered_rows=3,
    )
    assert all(writer.append(accepted_row(manifest(i))) for i in range(3))
    assert not writer.append(accepted_row(manifest(3)))
    assert writer.stats.dropped_full == 1

    async def refuse(*_args: object, **_kwargs: object) -> str:
        raise Unavailable("put", "k", "down")

    real_put = store.put
    store.put = refuse  # type: ignore[method-assign]
    await writer.flush()
    assert writer.buffered == 3 and writer.stats.flush_failures == 1
    store.put = real_put  # type: ignore[method-assign]
    await writer.flush()
    assert writer.buffered == 0 and writer.stats.rows_written == 3


async def test_catalog_hour_is_the_union_of_its_files_and_compaction_keeps_every_row() -> None:
    clock = ManualClock(T0)
    store = MemoryStore(clock=clock)
    writer = catalog.CatalogWriter(store=store, clock=clock, rng=random.Random(1), epoch=3)
    hour = keys.UtcHour.from_unix_ns(T0)
    first = await writer.write(
        hour, [accepted_row(manifest(1)), accepted_row(manifest(2))], writer="steady"
    )
    second = await writer.write(
        hour, [accepted_row(manifest(2)), quarantine_row(conflict(1))], writer="steady"
    )
    assert first != second
    read = await read_hour(store, hour)
    assert len(read.rows) == 3 and len(read.files) == 2
    with pytest.raises(ValueError, match="belongs to"):
        await writer.write(hour.next(), [accepted_row(manifest(1))], writer="steady")

    compaction = await merge_files(store, writer, hour, read.files, level=1)
    assert compaction.rows == 3 and set(compaction.inputs) == {first, second}
    assert (
        await catalog.delete_compacted_inputs(store, hour, store_now_ns=clock.now_ns(), grace_s=60)
        == 0
    )
    clock.advance(61)
    assert (
        await catalog.delete_compacted_inputs(store, hour, store_now_ns=clock.now_ns(), grace_s=60)
        == 2
    )
    after = await read_hour(store, hour)
    assert [info.key for info in after.files] == [compaction.merged_key] and len(after.rows) == 3


async def test_an_unreadable_catalog_file_is_never_read_as_no_rows() -> None:
    clock = ManualClock(T0)
    store = MemoryStore(clock=clock)
    hour = keys.UtcHour.from_unix_ns(T0)
    await store.put(keys.index_catalog_key(hour, 1, 1), b"garbage")
    with pytest.raises(IndexFileError):
        await read_hour(store, hour)


def test_digest_sets_answer_membership_in_bulk() -> None:
    present = [f"accepted/v1/k{i}" for i in range(1000)]
    digests = KeyDigestSet()
    digests.add_keys(present[:600])
    digests.add_keys(present[400:900])
    assert len(digests) == 900
    mask = digests.contains(digests_of(present))
    assert mask[:900].all() and not mask[900:].any()
    shas = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(50)]
    prefixes = sha_prefixes(shas)
    assert prefixes[0] == np.uint64(int(shas[0][:16], 16))
    refs = ShaPrefixSet()
    refs.add(prefixes[:25])
    assert refs.contains(prefixes).tolist() == [True] * 25 + [False] * 25
    with pytest.raises(ValueError):
        sha_prefixes(["Z" * 64])


async def test_a_stop_during_a_flush_loses_no_row() -> None:
    """A graceful stop cancels the background flush while its segment is being created: the
    rows go back into the buffer and the final flush writes them (found by bench.steady)."""
    clock = ManualClock(T0)
    inner = MemoryStore(clock=clock)
    entered = asyncio.Event()

    class SlowFirstPut:
        url = inner.url
        calls = 0

        async def put(self, key: str, body: bytes, **kwargs: object) -> str:
            self.calls += 1
            if self.calls == 1:
                entered.set()
                await asyncio.sleep(3600)  # cancelled by stop()
            return await inner.put(key, body, **kwargs)  # type: ignore[arg-type]

    writer = IndexLogWriter(
        store=SlowFirstPut(),  # type: ignore[arg-type]
        clock=SystemClock(),
        rng=random.Random(1),
        writer_id="c1",
        flush_rows=3,
    )
    writer.start()
    assert all(writer.append(accepted_row(manifest(i))) for i in range(3))
    await asyncio.wait_for(entered.wait(), 5)

    await writer.stop(grace_s=5.0)

    assert writer.stats.rows_written == 3 and writer.stats.dropped_failed == 0
    assert len([k async for k in inner.list(keys.INDEX_LOG_PREFIX)]) == 1


def test_row_ranges_round_trip_and_old_files_read_them_as_null() -> None:
    plain = accepted_row(manifest(1))
    ranged = IndexRow(**{**_fields(accepted_row(manifest(2))), "raw_offset": 56, "raw_length": 100})
    table = read_table(encode([plain, ranged]), source="t")
    assert rows_of(table) == [plain, ranged]
    assert (plain.raw_offset, plain.raw_length) == (None, None)

    old = table_of([ranged]).drop_columns(["raw_offset", "raw_length"])
    sink = io.BytesIO()
    pq.write_table(old, sink)
    read = rows_of(read_table(sink.getvalue(), source="old"))
    assert read == [IndexRow(**{**_fields(ranged), "raw_offset": None, "raw_length": None})]
    assert {"raw_offset", "raw_length"} <= set(SCHEMA.names)


def _fields(row: IndexRow) -> dict[str, object]:
    return {name: getattr(row, name) for name in IndexRow.__slots__}
