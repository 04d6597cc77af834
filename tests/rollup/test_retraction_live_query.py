"""Issue 31 item 5, black-box test (b) end to end: a phantom row with a frame of its own
goes through the steady pass, the rollup, an audit (``phantom-row``), the retraction
command, the lease holder's next audit (its ``retracted`` row) and the rollup again, while
ONE designated query collector's ``/v1/query`` (built once, as the collector builds it:
`collector.query.setup.build_query`) answers throughout. At the end the same endpoint
answers without the phantom's points, its sums equal what was acknowledged, and its
``sealed_through_ns`` has moved on past the hour it was stuck at: the endpoint's
`Coverage` re-read the sealed hour it had cached when the ``retracted`` row's catalog
file landed (PROTOCOL §2, §3.7 "Retraction"), with no restart.

The endpoint's window is 4 h (``query.window_s``), longer than the whole story: the
phantom's frame is still held when the second rollup retracts it, and the live part
leaves it out because the snapshot lists it in ``ledger.retracted``
(`collector.query.window.live_part`; without that it came back as 5 live rows).

Everything runs in one process on a filesystem store under one `ManualClock` from the
fixed ``DATA_START_NS`` (no sleep, no wall-clock time): the real `SteadyScanner`,
`run_full_audit` (DuckDB), `reconciler.retractions.retract` and the real rollup job on the
session's shared local Spark session.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from collector.auth import Authenticator
from collector.metrics import CollectorMetrics
from collector.query.api import parse_query
from collector.query.setup import QueryParts, build_query
from config import Settings, TokenTable
from index.log_writer import IndexLogWriter
from index.rows import accepted_row, blob_row
from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.run import run_full_audit
from reconciler.problems import list_problems
from reconciler.retractions import retract
from reconciler.steady import SteadyScanner
from rollup.job.run import RunSummary, run_rollup
from rollup.read.verify import verify
from rollup.table.storage import StoreAccess
from store.fs import FileSystemStore
from tests.reconciler.conftest import context, make_settings
from tests.rollup.conftest import (
    DATA_START_NS,
    SentFrame,
    assert_rollup_equal,
    committed_rollup,
    expected_rollup,
    make_frame,
    settings,
)
from tests.rollup.dataset_builder import work_markers

S = 1_000_000_000
HOUR = keys.UtcHour.from_unix_ns(DATA_START_NS)
H1, H2 = HOUR.next(), HOUR.next().next()


def frame(seq: int, count: int, *, value: float) -> SentFrame:
    """``count`` points of ``cpu{host="h"}`` in the hour's first minute, accepted then."""
    rows = [(DATA_START_NS + (seq + i) * S, "cpu", value + i, {"host": "h"}) for i in range(count)]
    return make_frame(rows, seq_start=seq, accepted_at_ns=DATA_START_NS + seq * S)


def ts_range(sent: SentFrame) -> tuple[int, int]:
    first = DATA_START_NS + sent.manifest.seq_start * S
    return first, first + (sent.manifest.record_count - 1) * S


async def log_as_collectors_do(
    store: FileSystemStore, clock: ManualClock, real: list[SentFrame], phantom: SentFrame
) -> None:
    """The real batches as a collector accepts them (blob, manifest created, both rows
    logged with the create's ETag); the phantom's rows likewise, but its manifest was
    never created: only its blob is in the store."""
    writer = IndexLogWriter(store=store, clock=clock, rng=random.Random(3), writer_id="c1")
    for sent in [*real, phantom]:
        await store.put(sent.manifest.raw_blob_key, sent.frame, if_none_match=True)
        writer.append(blob_row(sent.sha256, sent.manifest.accepted_at_unix_ns))
        etag = '"0123456789abcdef0123456789abcdef"'
        if sent is not phantom:
            etag = await store.put(
                sent.manifest.manifest_key, sent.manifest.to_json(), if_none_match=True
            )
        row = accepted_row(sent.manifest, etag=etag, own_create=True, ts_range=ts_range(sent))
        writer.append(row)
    await writer.flush()


async def rollup(spark: SparkSession, store: FileSystemStore, clock: ManualClock) -> RunSummary:
    return await run_rollup(
        spark, store, access=StoreAccess(store.url), settings=settings(), clock=clock
    )


def answer_sums(answer: dict[str, Any]) -> tuple[int, float]:
    """(points, sum of values) of a points-shaped answer, or (count, sum) of a rollup one."""
    columns = answer["columns"]
    if "count" in columns:
        count, total = columns.index("count"), columns.index("sum")
        return sum(r[count] for r in answer["rows"]), sum(r[total] for r in answer["rows"])
    value = columns.index("value")
    return len(answer["rows"]), sum(r[value] for r in answer["rows"])


def acknowledged(frames: list[SentFrame]) -> tuple[int, float]:
    count = sum(f.manifest.record_count for f in frames)
    return count, sum(expected["sum"] for expected in expected_rollup(frames).values())


async def test_b_a_retracted_phantom_leaves_a_live_query_and_its_hour_is_sealed_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    clock = ManualClock(DATA_START_NS + 60 * S)
    store = FileSystemStore(tmp_path / "store", clock=clock)
    real = [frame(0, 5, value=1.0), frame(10, 5, value=100.0)]
    phantom = frame(5, 5, value=1000.0)  # same minute and series as the real batches
    base = make_settings()
    config: Settings = base.model_copy(
        update={
            "store": base.store.model_copy(update={"url": store.url}),
            "query": base.query.model_copy(
                update={
                    "designated": True,
                    "refresh_interval_s": 0.0,
                    "window_s": 4 * 3600.0,
                    "history_wait_s": 60.0,  # answers wait for the history read
                }
            ),  # refreshed on every answer: nothing here depends on the wall clock
        }
    )
    ctx = await context(store, clock, settings=config)
    parts: QueryParts = build_query(
        config,
        store=store,
        clock=clock,
        metrics=CollectorMetrics(),
        authenticator=Authenticator(TokenTable([])),
    )
    endpoint, follower = parts.endpoint, parts.follower
    assert follower is not None

    async def ask(**params: str) -> dict[str, Any]:
        """The hour's ``cpu`` points (or minutes), asked of the one endpoint, after the
        follower's poll (the collector's loop)."""
        await follower.poll_once()
        assert follower.ready and not follower.behind
        query = {"metric": "cpu", "from": str(HOUR.start_ns // S), "to": str(H1.start_ns // S)}
        query.update(params)
        parsed = parse_query({k: [v] for k, v in query.items()}, now_ns=clock.now_ns())
        return await endpoint.answer(parsed)

    await log_as_collectors_do(store, clock, real, phantom)
    steady = await SteadyScanner(ctx).run_pass()
    assert steady.rows_cataloged == 3  # the phantom's row too: attested by its "create"
    live = await ask()
    assert live["snapshot_version"] is None and live["sources"]["live_batches"] == 3
    assert not live["complete"] and answer_sums(live) == acknowledged([*real, phantom])
    first = await rollup(spark, store, clock)
    assert first.batches == 3 and first.points == 15

    # 11:10: a listing audit seals the hour and finds the phantom (no record behind its row).
    clock.advance(70 * 60)
    assert (await run_full_audit(ctx)).status == "completed"
    phantoms = [r.subject_key async for _key, r in list_problems(store, "phantom-row") if r]
    assert phantoms == [phantom.manifest.manifest_key]
    counted = await ask()
    assert counted["snapshot_version"] == 1 and counted["sources"]["live_rows"] == 0
    assert counted["sealed_through_ns"] == H1.start_ns and counted["complete"]
    assert answer_sums(counted) == acknowledged([*real, phantom])  # the phantom is counted

    # The operator retracts it; at 12:10 the lease holder's audit writes the retracted row.
    await retract(store, clock, phantom.manifest.manifest_key, reason="no manifest", by="ops")
    clock.advance(3600)
    assert (await run_full_audit(ctx)).status == "completed"
    stuck = await ask()
    # The hour's catalog no longer counts the phantom; the snapshot's ledger still does.
    assert stuck["snapshot_version"] == 1 and stuck["sealed_through_ns"] == HOUR.start_ns
    assert not stuck["complete"] and answer_sums(stuck) == acknowledged([*real, phantom])

    second = await rollup(spark, store, clock)
    assert [r["batches"] for r in second.retracted] == [[phantom.manifest_id]]
    clock.advance(60)
    final = await ask()
    assert endpoint.window is not None
    held = [b.manifest_id for b in endpoint.window.batches() if b.frame_sha256 == phantom.sha256]
    assert held == [
        phantom.manifest_id
    ]  # still held: only the snapshot's retracted list keeps it out
    assert final["snapshot_version"] == 2
    assert final["sealed_through_ns"] == H2.start_ns and final["complete"]
    assert final["sources"]["live_rows"] == 0 and final["sources"]["dropped_missing"] == 0
    assert answer_sums(final) == acknowledged(real)
    minutes = await ask(step="1m")
    assert minutes["complete"] and answer_sums(minutes) == acknowledged(real)
    assert_rollup_equal(await committed_rollup(store), expected_rollup(real))
    report = await verify(store)
    assert report.ok, [h.describe() for h in report.hours]
    assert await work_markers(store) == []
