"""Each included batch's span of point times, out of core (`index.catalog_spans`): from
the row that counts of each key, null bounds and missing rows the widest, a batch under
both agent key forms once. Over merge histories it is checked against the row-by-row
reference in `tests/index/test_catalog_rank.py`."""

from __future__ import annotations

import dataclasses
import random

import pyarrow as pa
import pytest

from index.catalog import CatalogWriter
from index.catalog_spans import HIGHEST, LOWEST, read_hour_spans
from index.rows import IndexFileError, accepted_row, encode
from protocol import keys
from protocol.clock import ManualClock
from store.memory import MemoryStore
from tests.index.test_index_files import T0, manifest

HOUR = keys.UtcHour.from_unix_ns(T0)


def pairs(spans: tuple[object, object]) -> list[tuple[int, int]]:
    mins, maxs = spans
    return sorted(zip(mins.tolist(), maxs.tolist(), strict=True))  # type: ignore[attr-defined]


async def test_spans_come_from_the_row_that_counts_and_the_widest_when_unknown() -> None:
    store = MemoryStore()
    writer = CatalogWriter(store=store, clock=ManualClock(T0), rng=random.Random(1), epoch=1)
    known = accepted_row(manifest(1), ts_range=(5, 7))
    unbounded = accepted_row(manifest(2))  # written before the span columns: nulls
    stale = accepted_row(manifest(3), ts_range=(1, 2))
    superseding = dataclasses.replace(stale, min_ts_ns=20, max_ts_ns=30, etag='"new"')
    long_agent = manifest(4, agent="x" * 128)
    legacy_key = keys.legacy_accepted_manifest_key(long_agent.identity)
    assert legacy_key is not None
    both_forms = [
        accepted_row(long_agent, ts_range=(10, 12)),
        accepted_row(long_agent, key=legacy_key, ts_range=(8, 11)),
    ]
    not_included = accepted_row(manifest(5), ts_range=(0, 1))
    phantom = accepted_row(manifest(6), ts_range=(3, 4))
    retracted = dataclasses.replace(phantom, kind="retracted")  # absent (PROTOCOL §3.7)
    await writer.write(HOUR, [known, unbounded, stale, *both_forms, phantom], writer="steady")
    await writer.write(HOUR, [superseding, not_included, retracted], writer="steady")
    included = pa.array(
        [r.manifest_id for r in (known, unbounded, stale, both_forms[0], phantom)]
        + ["agent=6e6f6e65.boot=00000000000000000000000000000007.1-1"],  # no row at all
        pa.string(),
    )

    spans = await read_hour_spans(store, HOUR, included)

    everything = (LOWEST, HIGHEST)
    assert pairs(spans) == sorted([(5, 7), everything, (20, 30), (8, 12), everything, everything])


async def test_an_hour_without_catalog_files_spans_all_time_and_nothing_asked_reads_nothing() -> (
    None
):
    store = MemoryStore()
    ids = pa.array(["agent=61.boot=00.1-1", "agent=61.boot=00.1-1", "agent=62.boot=00.1-1"])
    assert pairs(await read_hour_spans(store, HOUR, ids)) == [(LOWEST, HIGHEST)] * 2
    assert pairs(await read_hour_spans(store, HOUR, pa.array([], pa.string()))) == []


async def test_a_row_of_another_hour_is_refused() -> None:
    store = MemoryStore()
    stray = accepted_row(manifest(1, at_ns=T0 + 2 * 3600 * 10**9), ts_range=(1, 2))
    await store.put(keys.index_catalog_key(HOUR, 1, 1), encode([stray]))
    with pytest.raises(IndexFileError, match="malformed"):
        await read_hour_spans(store, HOUR, pa.array([stray.manifest_id]))
