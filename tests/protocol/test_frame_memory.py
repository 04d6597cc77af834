"""`check_payload` and `payload_check_memory_bound`: what the collector's frame check may
allocate is bounded by the header, whatever the frame's shape (issue 10 item 3).

Arrow allocations are measured exactly with a proxy memory pool installed as the default
(every pyarrow call here allocates from the default pool); the decompressed stream is a
Python ``bytes`` of ``payload_raw_len`` and is added to the count. Arrow's per-message C++
structures are not pool allocations: the message cap bounds them (its own test).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pyarrow as pa
import pytest
import zstandard

from protocol import frame as fr
from tests.protocol import frame_vectors as v


def bomb_table(rows: int) -> pa.Table:
    """A dictionary-encoded metric of one 256-byte value, ``rows`` rows, nothing else."""
    return pa.table(
        {
            "ts": pa.array([0] * rows, pa.int64()).cast(v.TS),
            "metric": pa.DictionaryArray.from_arrays(
                pa.array([0] * rows, pa.int8()), pa.array(["m" * fr.MAX_METRIC_BYTES])
            ),
            "value": pa.array([0.0] * rows),
            "labels": pa.nulls(rows, v.LABELS),
        }
    )


def labels_table(rows: int) -> pa.Table:
    """The densest label shape: 64 two-byte keys per row, empty values."""
    keys = [chr(65 + k % 26) + chr(97 + k // 26) for k in range(fr.MAX_LABELS_PER_ROW)]
    entries = fr.MAX_LABELS_PER_ROW * rows
    labels = pa.MapArray.from_arrays(
        pa.array(range(0, entries + 1, fr.MAX_LABELS_PER_ROW), pa.int32()),
        pa.array(keys * rows),
        pa.array([""] * entries),
        type=v.LABELS,
    )
    return pa.table(
        {
            "ts": pa.array(range(rows), pa.int64()).cast(v.TS),
            "metric": pa.array(["m"] * rows),
            "value": pa.array([0.0] * rows),
            "labels": labels,
        }
    )


def compressed_frame(tbl: pa.Table, *, batch_rows: int | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, tbl.schema) as writer:
        for batch in tbl.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)
    raw = sink.getvalue().to_pybytes()
    payload = zstandard.ZstdCompressor(level=3).compress(raw)
    return v.spec_frame(
        payload=payload, flags=0x01, payload_raw_len=len(raw), record_count=tbl.num_rows
    )


@contextmanager
def measured_pool() -> Iterator[pa.MemoryPool]:
    previous = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(previous)
    pa.set_memory_pool(pool)
    try:
        yield pool
    finally:
        pa.set_memory_pool(previous)


def peak_bytes(run: Callable[[], object], raw_len: int) -> int:
    with measured_pool() as pool:
        run()
        return int(pool.max_memory()) + raw_len


def refusal_and_peak(run: Callable[[], object]) -> tuple[str, int]:
    """The FrameError ``run`` raises and the Arrow memory it took (the error and its
    traceback, which hold Arrow buffers, are dropped before the measuring pool goes)."""
    message = ""
    with measured_pool() as pool:
        try:
            run()
        except fr.FrameError as exc:
            message = str(exc)
        peak = int(pool.max_memory())
    assert message, "not refused"
    return message, peak


def test_a_dictionary_bomb_is_checked_without_expanding_the_dictionary() -> None:
    rows = 400_000
    data = compressed_frame(bomb_table(rows))
    header = fr.decode_header(data)
    assert len(data) < 4096  # a few KB on the wire...
    expanded = rows * fr.MAX_METRIC_BYTES  # ...that decode_frame turns into this much

    checked = peak_bytes(
        lambda: fr.check_payload(data, header, max_raw_bytes=2**32 - 1), header.payload_raw_len
    )

    bound = fr.payload_check_memory_bound(data, header)
    assert checked <= bound < expanded
    decoded = peak_bytes(
        lambda: fr.decode_frame(data, max_raw_bytes=2**32 - 1), header.payload_raw_len
    )
    assert decoded > expanded  # what the collector no longer does


def test_a_dictionary_bomb_decoding_past_max_raw_bytes_is_refused_before_it_expands() -> None:
    rows = 400_000
    data = compressed_frame(bomb_table(rows))
    header = fr.decode_header(data)
    limit = 64 * 1024 * 1024
    assert header.payload_raw_len < limit < rows * fr.MAX_METRIC_BYTES

    for run in (
        lambda: fr.check_payload(data, header, max_raw_bytes=limit),
        lambda: fr.decode_frame(data, max_raw_bytes=limit),
    ):
        message, peak = refusal_and_peak(run)
        assert "metric dictionary expanded per row" in message
        assert f"> max_raw_bytes {limit}" in message
        assert peak < fr.payload_check_memory_bound(data, header)
    opened = fr.open_payload(data, header, max_raw_bytes=2**32 - 1)
    assert opened.decoded_bytes >= rows * fr.MAX_METRIC_BYTES
    decoded = peak_bytes(opened.decode, 0)
    assert decoded <= opened.decoded_bytes  # the bound a reader charges before decoding


def test_a_normal_dictionary_frame_is_charged_its_rows_not_its_longest_value() -> None:
    long_name, rows = "m" * fr.MAX_METRIC_BYTES, 10_000
    names = [long_name] + ["cpu"] * (rows - 1)
    tbl = bomb_table(rows).set_column(1, "metric", pa.array(names).dictionary_encode())
    data = compressed_frame(tbl)
    header = fr.decode_header(data)
    limit = 2 * header.payload_raw_len  # well under rows x the longest value
    assert limit < rows * fr.MAX_METRIC_BYTES

    frame = fr.decode_frame(data, max_raw_bytes=limit)

    assert frame.points.column("metric").to_pylist() == names
    opened = fr.open_payload(data, header, max_raw_bytes=limit)
    assert opened.decoded_bytes < limit


def test_the_densest_labels_stay_within_the_bound() -> None:
    data = compressed_frame(labels_table(20_000))
    header = fr.decode_header(data)

    checked = peak_bytes(
        lambda: fr.check_payload(data, header, max_raw_bytes=2**32 - 1), header.payload_raw_len
    )

    assert checked <= fr.payload_check_memory_bound(data, header)


def test_a_frame_without_zstd_content_size_is_charged_its_window() -> None:
    raw = v.spec_stream(v.labels_table())
    with_size = zstandard.ZstdCompressor(level=3).compress(raw)
    streamer = zstandard.ZstdCompressor(level=3, write_content_size=False).compressobj()
    without_size = streamer.compress(raw) + streamer.flush()
    frames = [
        v.spec_frame(
            payload=payload,
            flags=0x01,
            payload_raw_len=len(raw),
            record_count=v.labels_table().num_rows,
        )
        for payload in (with_size, without_size)
    ]
    bounds = [fr.payload_check_memory_bound(f, fr.decode_header(f)) for f in frames]
    window = zstandard.get_frame_parameters(without_size).window_size
    assert bounds[1] - bounds[0] == window
    for data in frames:  # both are valid
        fr.check_payload(data, fr.decode_header(data), max_raw_bytes=len(raw))


def test_more_ipc_messages_than_the_cap_are_refused_before_decoding() -> None:
    rows = fr.MAX_PAYLOAD_MESSAGES  # a batch per row, plus the schema and the dictionary
    data = compressed_frame(bomb_table(rows), batch_rows=1)
    header = fr.decode_header(data)

    with pytest.raises(fr.FrameError) as refused:
        fr.check_payload(data, header, max_raw_bytes=2**32 - 1)
    assert f"more than {fr.MAX_PAYLOAD_MESSAGES} messages" in str(refused.value)
    with pytest.raises(fr.FrameError):
        fr.decode_frame(data)
    fine = compressed_frame(bomb_table(rows - 2), batch_rows=1)  # exactly at the cap
    fr.check_payload(fine, fr.decode_header(fine), max_raw_bytes=2**32 - 1)


def test_check_payload_accepts_exactly_what_decode_frame_accepts() -> None:
    for data in (
        v.minimal_frame(),
        v.labels_frame(),
        v.dictionary_metric_frame(),
        v.extra_column_frame(),
        v.dictionary_delta_frame(),
    ):
        fr.decode_frame(data)
        fr.check_payload(data, fr.decode_header(data), max_raw_bytes=2**20)


def test_an_unreferenced_bad_dictionary_value_is_not_a_row() -> None:
    tbl = bomb_table(2).set_column(
        1, "metric", pa.DictionaryArray.from_arrays([0, 0], pa.array(["ok", "m" * 300]))
    )
    data = v.spec_frame(payload=v.spec_stream(tbl), record_count=2)
    assert fr.decode_frame(data).points.column("metric").to_pylist() == ["ok", "ok"]
    fr.check_payload(data, fr.decode_header(data), max_raw_bytes=2**20)


def test_unparsable_zstd_header_is_charged_the_largest_window() -> None:
    body = v.spec_frame(payload=b"\x00" * 16, flags=0x01, payload_raw_len=1000)
    header = fr.decode_header(body)
    assert fr.payload_check_memory_bound(body, header) >= 8 * 1024 * 1024
    with pytest.raises(fr.FrameError):
        fr.check_payload(body, header, max_raw_bytes=2**20)
