"""`reconciler.audit.blobs_act.confirm_missing`: the missing-blob candidates are HEADed in
raw-key order, whatever order the engine wrote ``referencing.parquet`` in (DuckDB's
threads write it in no defined order), so a seeded simulation replays the same requests."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from reconciler.audit import blobs_act
from reconciler.audit.engines.duckdb_joins import JoinResults
from store.memory import MemoryStore


class _HeadOrder(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.heads: list[str] = []

    async def head(self, key: str) -> Any:
        self.heads.append(key)
        return await super().head(key)


def test_missing_candidates_are_headed_in_raw_key_order(tmp_path: Path) -> None:
    results = JoinResults.in_dir(str(tmp_path))
    raw_keys = [f"raw-blobs/v1/sha256/{c}{c}/{c * 64}.lmbatch" for c in "fa0c"]
    pq.write_table(
        pa.table({"raw_key": raw_keys, "record_key": [f"accepted/{c}" for c in "fa0c"]}),
        results.referencing,
    )
    store = _HeadOrder()
    asyncio.run(store.put(raw_keys[1], b"present"))
    ctx: Any = SimpleNamespace(store=store)

    missing = asyncio.run(blobs_act.confirm_missing(ctx, results))

    assert store.heads == sorted(raw_keys)
    assert missing == {
        k: f"accepted/{c}" for k, c in zip(raw_keys, "fa0c", strict=True) if c != "a"
    }
