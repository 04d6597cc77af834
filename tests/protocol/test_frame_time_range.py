"""The points' time range a frame check returns (the index rows' ``min_ts``/``max_ts``,
PROTOCOL §3.7; late batches, §2): `check_payload`, `frame_time_range` and the decoded
points agree, whatever the order of the points and however many record batches the
stream holds."""

from __future__ import annotations

import pyarrow as pa
import pytest

from protocol import frame as fr
from tests.protocol import frame_vectors as v

OFFSETS = [5, 1, 9, 3, 7]  # unsorted: neither the first nor the last row is an extreme


def points() -> pa.Table:
    rows = len(OFFSETS)
    return pa.table(
        {
            "ts": pa.array([v.TS0 + offset for offset in OFFSETS], v.TS),
            "metric": pa.array(["m"] * rows),
            "value": pa.array([float(i) for i in range(rows)]),
            "labels": pa.array([{"k": str(i)} for i in range(rows)], v.LABELS),
        }
    )


@pytest.mark.parametrize("batch_rows", [None, 1, 2], ids=["one-batch", "1-row", "2-row"])
def test_time_range_is_the_min_and_max_of_the_points(batch_rows: int | None) -> None:
    tbl = points()
    if batch_rows is not None:
        tbl = pa.Table.from_batches(tbl.to_batches(max_chunksize=batch_rows))
        assert tbl.column("ts").num_chunks == len(OFFSETS) // batch_rows + (
            len(OFFSETS) % batch_rows > 0
        )
    data = v.spec_frame(payload=v.spec_stream(tbl), record_count=tbl.num_rows)
    expected = (v.TS0 + min(OFFSETS), v.TS0 + max(OFFSETS))

    header = fr.decode_header(data)
    assert fr.check_payload(data, header, max_raw_bytes=1 << 20) == expected
    assert fr.frame_time_range(data) == expected
    decoded = fr.decode_frame(data).points
    assert decoded.column("ts").cast(pa.int64()).to_pylist() == [
        v.TS0 + offset for offset in OFFSETS
    ]
    assert decoded.column("value").to_pylist() == [float(i) for i in range(len(OFFSETS))]
