"""The fleet into our collectors (issue 32: "through remote_write and native frames"):
each series goes by one channel (`fleet.Series.channel`, half each), in batches of
`SLICE_MS` of data time.

- ``remote_write``: ``POST /api/v1/write`` bodies (snappy ``WriteRequest``) under the
  series' *stored* names, millisecond timestamps (what the protocol carries).
- ``frame``: native frames (``POST /v1/batches``) built column-wise with Arrow, at the
  sample's millisecond plus its own microsecond (`fleet.Series.us`), so the read path
  must floor microseconds to the millisecond the reference holds. Their slices are
  offset by half a slice, so one frame holds points on both sides of 11:00: the batch
  that is in the ledger and in the window at the range split of check (c).

Both keep the stale markers' bits (the protobuf ``double`` and Arrow's float64 carry
them unchanged).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import aiohttp
import cramjam
import numpy as np
import pyarrow as pa

from collector.receivers.proto.wire_pb2 import WriteRequest
from protocol.frame_encode import encode_frame
from tests.collector.promql.diff.fleet import T0_MS, Fleet, Series

SLICE_MS = 10 * 60 * 1000
FRAME_OFFSET_MS = SLICE_MS // 2
FRAME_AGENT = "agent-diff-frames"
WRITE_AGENT = "agent-diff-remote-write"
BOOT = uuid.UUID("5f0c6a2e-0000-4000-8000-00000000d1ff")
LABELS_TYPE = pa.map_(pa.string(), pa.string())


@dataclass(frozen=True)
class Batch:
    channel: str
    body: bytes
    first_ms: int
    last_ms: int
    points: int


def _slice(series: Series, start_ms: int, end_ms: int) -> slice:
    lo, hi = np.searchsorted(series.ts_ms, [start_ms, end_ms])
    return slice(int(lo), int(hi))


def _starts(fleet: Fleet, offset_ms: int) -> range:
    first, last = int(fleet.all_ts_ms().min()), int(fleet.all_ts_ms().max())
    start = T0_MS + offset_ms - SLICE_MS
    while start + SLICE_MS <= first:
        start += SLICE_MS
    return range(start, last + 1, SLICE_MS)


def remote_write_batches(fleet: Fleet) -> list[Batch]:
    chosen = [s for s in fleet.series if s.channel == "remote_write"]
    batches = []
    for start in _starts(fleet, 0):
        request = WriteRequest()
        first, last, points = None, None, 0
        for series in chosen:
            part = _slice(series, start, start + SLICE_MS)
            if part.start == part.stop:
                continue
            entry = request.timeseries.add()
            entry.labels.add(name="__name__", value=series.metric)
            for name, value in sorted(series.labels.items()):
                entry.labels.add(name=name, value=value)
            times, values = series.ts_ms[part].tolist(), series.values[part].tolist()
            for value, timestamp in zip(values, times, strict=True):
                entry.samples.add(value=value, timestamp=timestamp)
            first = min(first or times[0], times[0])
            last = max(last or times[-1], times[-1])
            points += len(times)
        if points:
            assert first is not None and last is not None
            body = bytes(cramjam.snappy.compress_raw(request.SerializeToString()))
            batches.append(Batch("remote_write", body, first, last, points))
    return batches


def frame_batches(fleet: Fleet) -> list[Batch]:
    chosen = [s for s in fleet.series if s.channel == "frame"]
    batches, seq = [], 0
    for start in _starts(fleet, FRAME_OFFSET_MS):
        parts = [(s, _slice(s, start, start + SLICE_MS)) for s in chosen]
        parts = [(s, p) for s, p in parts if p.start != p.stop]
        if not parts:
            continue
        counts = np.array([p.stop - p.start for _, p in parts], dtype=np.int64)
        ts_ns = np.concatenate([s.ts_ns[p] for s, p in parts])
        values = np.concatenate([s.values[p] for s, p in parts])
        rows = pa.array(np.repeat(np.arange(len(parts)), counts))  # each row's series
        metrics = pa.array([s.metric for s, _ in parts], pa.string()).take(rows)
        labels = pa.array([list(s.labels.items()) for s, _ in parts], LABELS_TYPE).take(rows)
        table = pa.table(
            {
                "ts": pa.array(ts_ns, pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
                "metric": metrics,
                "value": pa.array(values, pa.float64()),
                "labels": labels,
            }
        )
        body = encode_frame(agent_id=FRAME_AGENT, boot_id=BOOT, seq_start=seq, points=table)
        seq += table.num_rows
        first_ms, last_ms = int(ts_ns.min() // 1_000_000), int(ts_ns.max() // 1_000_000)
        batches.append(Batch("frame", body, first_ms, last_ms, table.num_rows))
    return batches


def batches(fleet: Fleet) -> list[Batch]:
    """Every batch of both channels, by their first point's time."""
    found = remote_write_batches(fleet) + frame_batches(fleet)
    assert sum(b.points for b in found) == fleet.samples
    return sorted(found, key=lambda b: (b.first_ms, b.channel))


async def send(
    session: aiohttp.ClientSession, base_url: str, batch: Batch, token: str
) -> dict[str, object]:
    """One batch to a collector; fails unless it is stored whole (nothing dropped)."""
    headers = {"Authorization": f"Bearer {token}"}
    if batch.channel == "remote_write":
        path = "/api/v1/write"
        headers.update(
            {
                "Content-Type": "application/x-protobuf",
                "Content-Encoding": "snappy",
                "X-Lightmetrics-Agent-Id": WRITE_AGENT,
            }
        )
    else:
        path = "/v1/batches"
        headers["Content-Type"] = "application/x-lmbatch"
    async with session.post(f"{base_url}{path}", data=batch.body, headers=headers) as answer:
        text = await answer.text()
        assert answer.status == 200, f"{path}: {answer.status} {text[:500]}"
        body: dict[str, object] = await answer.json(content_type=None)
    assert not body.get("dropped"), (
        f"{path} dropped points of the fleet: {body.get('dropped')} (PROTOCOL §5 keeps every "
        "stored float64 bit for bit, staleness markers included)"
    )
    return body
