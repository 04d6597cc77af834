"""The first audit of the rank era reads back every key with rows of more than one rank
(PROTOCOL §3.7, `index.catalog_rank`; issue 31 item 3).

Catalog files written before the rank columns rank as the files they are, so a merge of
then may have made a stale row outrank a superseding one. The row that counts may even
agree with the store on every field the audit compares (hash, hour, ETag: a row of
before the ``etag`` column takes the listed one), yet carry a stale
``accepted_frame_sha256``: only reading the key back finds it. Later audits do not read
such keys again.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import pyarrow.parquet as pq

from index.catalog_rank import RANK_COLUMNS
from index.catalog_tables import read_hour_table
from index.rows import quarantine_row, table_of
from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.run import run_full_audit
from store.memory import MemoryStore
from tests.reconciler.conftest import T0_NS, context, make_batch, write_batch, write_conflict


class CountingGets(MemoryStore):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.gets: dict[str, int] = {}

    async def get(self, key: str) -> tuple[bytes, str]:
        self.gets[key] = self.gets.get(key, 0) + 1
        return await super().get(key)


def legacy_file(rows: list[Any]) -> bytes:
    """A catalog file as a version before the rank columns wrote it."""
    sink = io.BytesIO()
    pq.write_table(table_of(rows).drop_columns(list(RANK_COLUMNS)), sink, compression="zstd")
    return sink.getvalue()


async def counted_accepted_sha(store: MemoryStore, row: Any) -> str | None:
    table = (await read_hour_table(store, row.hour)).table
    found = dict(
        zip(
            table.column("key").to_pylist(),
            table.column("accepted_frame_sha256").to_pylist(),
            strict=True,
        )
    )
    return found[row.key]


async def test_the_first_audit_of_the_rank_era_reads_back_keys_of_several_ranks(
    clock: ManualClock,
) -> None:
    store = CountingGets(clock=clock)
    batch = make_batch(0, 1, T0_NS)
    await write_batch(store, batch)
    conflict = await write_conflict(store, batch, T0_NS + keys.NS_PER_S)
    _body, etag = await store.get(conflict.quarantine_key)
    truth = quarantine_row(conflict, etag=etag)
    # Stale: another (existing) blob as the accepted side, and no ETag column yet.
    stale = dataclasses.replace(truth, accepted_frame_sha256=truth.frame_sha256, etag=None)
    hour = truth.hour
    # The superseding (true) row in an older name, the stale one in a legacy merged file
    # whose name sorts after it: ranked by file name, the stale row counts.
    await store.put(keys.index_catalog_key(hour, 1, 15), legacy_file([truth]))
    await store.put(keys.index_catalog_key(hour, 1, 20), legacy_file([stale]))
    clock.advance(7200)
    assert await counted_accepted_sha(store, truth) == stale.accepted_frame_sha256

    ctx = await context(store, clock)
    store.gets.clear()
    first = await run_full_audit(ctx)
    assert first.status == "completed" and first.reread_ranks is True
    assert store.gets.get(conflict.quarantine_key, 0) >= 1  # read back: two ranks
    assert await counted_accepted_sha(store, truth) == truth.accepted_frame_sha256

    clock.advance(3600)
    store.gets.clear()
    second = await run_full_audit(ctx)
    assert second.status == "completed" and second.reread_ranks is False
    assert store.gets.get(conflict.quarantine_key) is None  # not again
