"""Which catalog row of a key counts (PROTOCOL §3.7, `index.catalog_rank`; issue 31 item 3).

The row written last counts, by the rank of the file it was *first* written in, through
every merge. Ranking by the merged file's own name let a merge of a stale row outrank a
superseding row written after the stale row's first merge. Every reader goes through the
one definition: the Arrow hour (`read_hour_table`), DuckDB hour totals (ledger checks,
verify) and spans (the live query's late batches, `index.catalog_spans`), the rollup
planner (`rollup.job.plan_sql`), the merge itself, the audit's joins
(`reconciler.audit.engines.duckdb_joins`) and the chaos auditor (`chaos.catalog_rows`);
the Spark audit is compared with the local one in
`tests/reconciler/test_audit_spark_run.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import random
import tempfile
from pathlib import Path

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.catalog_rows import read_hour
from chaos.index_checks import read_catalog
from index.catalog import CatalogWriter, list_hour_files
from index.catalog_local import MergeLimits
from index.catalog_merge import merge_files
from index.catalog_rank import packed_rank, with_rank
from index.catalog_spans import HIGHEST, LOWEST, read_hour_spans
from index.catalog_tables import hour_totals, read_hour_table, read_hour_totals
from index.rows import IndexRow, accepted_row, table_of
from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.engines.duckdb_joins import AuditJoins, fetch_catalog
from rollup.job.plan_sql import pending_items
from store.memory import MemoryStore
from tests.index.test_index_files import T0, manifest

HOUR = keys.UtcHour.from_unix_ns(T0)
NO_ROW_ID = "agent=6e6f6e65.boot=00000000000000000000000000000007.1-1"


def version(seq: int, n: int) -> IndexRow:
    """Key ``seq``'s row in its ``n``-th version: its own hash, ETag and span (none at
    first: a row written before the span columns), as a superseding row written from the
    store's record after a mismatch would carry."""
    row = accepted_row(manifest(seq))
    if n == 0:
        return dataclasses.replace(row, etag=f'"v{n}"')
    sha = hashlib.sha256(f"{seq}/{n}".encode()).hexdigest()
    return dataclasses.replace(
        row,
        frame_sha256=sha,
        raw_blob_key=keys.raw_blob_key(sha),
        etag=f'"v{n}"',
        min_ts_ns=100 * seq + n,
        max_ts_ns=100 * seq + 2 * n,
    )


class History:
    """Catalog files of one hour written and merged, with the reference: per key, the
    row written last (in time), whatever merges happened since."""

    def __init__(self) -> None:
        self.clock = ManualClock(T0)
        self.store = MemoryStore(clock=self.clock)
        self.writer = CatalogWriter(
            store=self.store, clock=self.clock, rng=random.Random(1), epoch=2
        )
        self.last: dict[str, IndexRow] = {}

    async def write(self, rows: list[IndexRow]) -> str:
        self.clock.advance(1)
        name = await self.writer.write(HOUR, rows, writer="steady")
        for row in sorted(rows, key=lambda r: r.key):  # the writer sorts (stable) by key
            self.last[row.key] = row
        return name

    async def merge(self, names: list[str]) -> str:
        self.clock.advance(1)
        infos = [info for info in await list_hour_files(self.store, HOUR) if info.key in names]
        return (await merge_files(self.store, self.writer, HOUR, infos, level=1)).merged_key

    async def delete(self, name: str) -> None:
        await self.store.delete(name)

    async def files(self) -> list[str]:
        return [info.key for info in await list_hour_files(self.store, HOUR)]

    def expected(self) -> dict[str, tuple[str, str | None]]:
        return {key: (row.frame_sha256, row.etag) for key, row in self.last.items()}


async def readers_agree(history: History, tmp: str) -> None:
    """Every reader counts, for each key, the row written last."""
    want = history.expected()
    arrow = (await read_hour_table(history.store, HOUR)).table
    got = dict(
        zip(
            arrow.column("key").to_pylist(),
            zip(
                arrow.column("frame_sha256").to_pylist(),
                arrow.column("etag").to_pylist(),
                strict=True,
            ),
            strict=True,
        )
    )
    assert got == want, "read_hour_table"
    chaos = await read_hour(history.store, HOUR)
    assert {k: (r.frame_sha256, r.etag) for k, r in chaos.rows.items()} == want, "chaos"
    auditor = await read_catalog(history.store)  # the chaos auditor's view
    assert {k: (r.frame_sha256, r.etag) for k, r in auditor.rows.items()} == want, "auditor"
    rows = table_of(list(history.last.values()))
    reference = hour_totals(rows)
    totals = await read_hour_totals(history.store, HOUR, MergeLimits(spill_dir=tmp))
    assert totals == reference, "read_hour_totals"
    wanted = [row.manifest_id for row in history.last.values()] + [NO_ROW_ID]
    spans = await read_hour_spans(history.store, HOUR, pa.array(wanted), MergeLimits(spill_dir=tmp))
    assert sorted(zip(*(s.tolist() for s in spans), strict=True)) == sorted(
        [
            (
                LOWEST if r.min_ts_ns is None else r.min_ts_ns,
                HIGHEST if r.max_ts_ns is None else r.max_ts_ns,
            )
            for r in history.last.values()
        ]
        + [(LOWEST, HIGHEST)]
    ), "read_hour_spans"
    planned = await pending_items(history.store, [HOUR], [], MergeLimits(spill_dir=tmp))
    by_id = dict(
        zip(
            planned.column("manifest_id").to_pylist(),
            planned.column("frame_sha256").to_pylist(),
            strict=True,
        )
    )
    assert by_id == {r.manifest_id: r.frame_sha256 for r in history.last.values()}, "planner"
    names = await history.files()
    copies, unreadable = await fetch_catalog(history.store, names, str(Path(tmp, "audit")))
    assert unreadable == []
    with AuditJoins({}, copies, str(Path(tmp, "joins")), memory_limit_mb=64) as joins:
        newest = joins.newest_rows(sorted(want))
    assert {k: (sha, etag) for k, (etag, sha, *_rest) in newest.items()} == want, "audit"
    if len(names) >= 2:  # and a merge of everything keeps the same rows counting
        await history.merge(names)
        merged = (await read_hour_table(history.store, HOUR)).table
        assert dict(
            zip(merged.column("key").to_pylist(), merged.column("etag").to_pylist(), strict=True)
        ) == {k: etag for k, (_sha, etag) in want.items()}, "merge"
        # The hour is one merged file now (its inputs named by it): read without the
        # newest-per-key aggregate (`index.catalog_local.Copies.one_merged_file`), the same.
        limits = MergeLimits(spill_dir=tmp)
        assert await read_hour_totals(history.store, HOUR, limits) == reference, "merged totals"
        merged_spans = await read_hour_spans(history.store, HOUR, pa.array(wanted), limits)
        assert sorted(zip(*(s.tolist() for s in merged_spans), strict=True)) == sorted(
            zip(*(s.tolist() for s in spans), strict=True)
        ), "merged spans"


async def test_a_superseding_row_written_after_a_stale_rows_first_merge_counts_after_a_second() -> (
    None
):
    history = History()
    stale = await history.write([version(1, 0), version(2, 0)])
    other = await history.write([version(3, 0)])
    first_merge = await history.merge([stale, other])
    await history.delete(stale)
    await history.delete(other)
    superseding = await history.write([version(1, 1)])  # after the stale row's merge
    more = await history.write([version(4, 0)])
    # A level merge of the first merged file and a newer file, not the superseding one:
    # the second merge's name sorts after the superseding file's.
    second_merge = await history.merge([first_merge, more])
    assert second_merge > superseding
    await history.delete(first_merge)
    await history.delete(more)
    with tempfile.TemporaryDirectory() as tmp:
        await readers_agree(history, tmp)
    arrow = (await read_hour_table(history.store, HOUR)).table
    counted = dict(
        zip(arrow.column("key").to_pylist(), arrow.column("etag").to_pylist(), strict=True)
    )
    assert counted[version(1, 0).key] == '"v1"'


def test_a_rank_packs_in_tuple_order_and_null_ranks_are_the_files_own() -> None:
    assert packed_rank(1, 0, 0) > packed_rank(0, 10**10 - 1, 2**32 - 1)
    assert packed_rank(3, 5, 1) > packed_rank(3, 4, 2**32 - 1) > packed_rank(3, 4, 7)
    name = keys.index_catalog_key(HOUR, 9, 1234)
    table = with_rank(table_of([version(1, 0), version(2, 0)]), name)
    assert table.select(["first_epoch", "first_sequence", "first_position"]).to_pylist() == [
        {"first_epoch": 9, "first_sequence": 1234, "first_position": 0},
        {"first_epoch": 9, "first_sequence": 1234, "first_position": 1},
    ]
    merged = with_rank(table, keys.index_catalog_key(HOUR, 9, 2000))  # keeps its ranks
    assert merged.column("first_sequence").to_pylist() == [1234, 1234]


operation = st.one_of(
    st.tuples(
        st.just("write"),
        st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=4),
    ),
    st.tuples(st.just("merge"), st.lists(st.integers(0, 20), min_size=2, max_size=4, unique=True)),
    st.tuples(st.just("delete-inputs"), st.integers(0, 20)),
)


@settings(max_examples=25, deadline=None)
@given(st.lists(operation, min_size=1, max_size=12))
def test_every_reader_counts_the_row_written_last_over_any_merge_history(
    operations: list[tuple[str, object]],
) -> None:
    async def scenario() -> None:
        history = History()
        version_of: dict[int, int] = {}
        merged: dict[str, list[str]] = {}
        for op, arg in operations:
            files = await history.files()
            if op == "write":
                rows = []
                for seq, _ in arg:  # type: ignore[union-attr]
                    version_of[seq] = version_of.get(seq, -1) + 1
                    rows.append(version(seq, version_of[seq]))
                await history.write(rows)
            elif op == "merge" and len(files) >= 2:
                picked = sorted({files[i % len(files)] for i in arg})  # type: ignore[union-attr]
                if len(picked) >= 2:
                    merged[await history.merge(picked)] = picked
            elif op == "delete-inputs" and merged:
                name = sorted(merged)[int(arg) % len(merged)]  # type: ignore[call-overload]
                for doomed in merged.pop(name):
                    if doomed in files and doomed != name:
                        await history.delete(doomed)
        if history.last:
            with tempfile.TemporaryDirectory() as tmp:
                await readers_agree(history, tmp)

    asyncio.run(scenario())
