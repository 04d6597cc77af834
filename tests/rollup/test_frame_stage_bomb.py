"""Issue 24 item 8, stage 1: a stored frame whose dictionary-encoded metric would decode
past ``max_raw_bytes`` (accepted before intake refused such frames) is a ``corrupt-blob``
problem, refused before it is expanded: not an executor out of memory on every run.
Stage 1 runs here in this process (`FrameStage.run` is what ``mapInArrow`` calls)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pytest

import protocol.frame
from protocol import frame as fr
from protocol import keys
from rollup.job.frame_stage import FrameStage
from rollup.job.tasks import WORK_SCHEMA, WriteOptions
from rollup.table.storage import StoreAccess
from tests.collector.test_decode_amplification import bomb_frame


def test_stage_one_reports_a_dictionary_bomb_without_expanding_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = 20_000
    body = bomb_frame(rows)
    header = fr.decode_header(body)
    limit = 1 << 20  # the payload fits; its points (~5.6 MB) do not
    assert header.payload_raw_len < limit < rows * fr.MAX_METRIC_BYTES
    sha = hashlib.sha256(body).hexdigest()
    blob_key = keys.raw_blob_key(sha)
    (tmp_path / blob_key).parent.mkdir(parents=True)
    (tmp_path / blob_key).write_bytes(body)
    manifest_id = keys.BatchIdentity(
        header.agent_id, header.boot_id, header.seq_start, header.seq_end
    ).manifest_id
    work = pa.RecordBatch.from_pylist(
        [
            {
                "manifest_id": manifest_id,
                "frame_sha256": sha,
                "raw_blob_key": blob_key,
                "accepted_hour": "2026-11-21T10",
                "record_count": rows,
            }
        ],
        schema=WORK_SCHEMA,
    )
    expanded: list[int] = []
    real_canonical = protocol.frame.CheckedPoints.canonical

    def counted(self: protocol.frame.CheckedPoints) -> pa.Table:
        expanded.append(self.decoded_bytes)
        return real_canonical(self)

    monkeypatch.setattr(protocol.frame.CheckedPoints, "canonical", counted)
    stage = FrameStage(WriteOptions(access=StoreAccess(f"file://{tmp_path}"), max_raw_bytes=limit))

    out = pa.Table.from_batches(list(stage.run(iter([work]))))

    kinds = out.column("kind").to_pylist()
    assert kinds.count("problem") == 1 and "ledger" not in kinds
    problem = json.loads(out.column("body")[kinds.index("problem")].as_py())
    assert problem["kind"] == "corrupt-blob" and problem["manifest_id"] == manifest_id
    assert "metric dictionary expanded per row" in problem["detail"]
    assert expanded == []  # nothing was decoded
