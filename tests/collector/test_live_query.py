"""``GET /v1/query`` in this process: parameters, the window, coverage, and answers over a
real snapshot (Parquet written with pyarrow, committed through `rollup.table.commit`, no Spark)
on a filesystem store, checked against an oracle: every batch's points counted once,
and the ``rollup_1m`` shape equal to aggregating all points at once."""

from __future__ import annotations

import dataclasses
import json
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from aiohttp.test_utils import make_mocked_request

from collector.auth import Authenticator
from collector.metrics import CollectorMetrics
from collector.query.api import LiveQuery, QueryError, parse_query
from collector.query.committed import SnapshotSource
from collector.query.coverage import Coverage, first_uncovered_ns
from collector.query.endpoint import QueryEndpoint
from collector.query.rows import json_rows, merge_points, rollup_of_points
from collector.query.window import LiveWindow, missing_dropped
from config import Principal, TokenTable, hash_token
from config.settings import QuerySettings
from index.audits import sealed_limit_ns
from index.catalog import CatalogWriter
from index.rows import accepted_row
from protocol import keys
from protocol.clock import ManualClock
from protocol.frame import Frame, decode_frame
from protocol.frame_encode import encode_frame, points_table
from protocol.records import AcceptedManifest, AuditRecord
from rollup.table.ledger import LedgerRow
from rollup.table.manifest import LedgerHour
from rollup.table.owner import OwnerLease
from rollup.table.points import points_rows
from rollup.table.storage import arrow_filesystem
from store.base import ObjectStore
from store.fs import FileSystemStore
from tests.rollup.dataset_builder import catalog_manifests, commit_rows

NS = 1_000_000_000
# Answers here wait for the history read (`collector.query.coverage`) to finish: a bound
# a correct run never reaches, so what they assert does not depend on the machine's speed.
HISTORY_WAIT_S = 60.0
H0 = keys.UtcHour(date(2026, 11, 21), 10)
H1 = H0.next()
BOOT = uuid.UUID("5f0c6a2e-0000-4000-8000-0000000000c1")
READ_TOKEN, WRITE_TOKEN = "reader-token", "writer-token"
TOKENS = TokenTable(
    [
        Principal(name="reader", token_sha256=hash_token(READ_TOKEN), read=True),
        Principal(name="writer", token_sha256=hash_token(WRITE_TOKEN), agents=("*",)),
    ]
)


# --- parameters -------------------------------------------------------------------------


def secs(ns: int) -> str:
    """A time as ``/v1/query`` takes it: unix seconds, with a fraction when needed."""
    whole, rest = divmod(ns, NS)
    return f"{whole}.{rest:09d}" if rest else str(whole)


def q(**params: str | list[str]) -> LiveQuery:
    query = {k: v if isinstance(v, list) else [v] for k, v in params.items()}
    return parse_query(query, now_ns=H1.start_ns)


def test_parse_defaults_and_shapes() -> None:
    parsed = q(metric="cpu", label=["host=a", "dc=x"])
    assert (parsed.from_ns, parsed.to_ns) == (H0.start_ns, H1.start_ns)
    assert parsed.labels == (("dc", "x"), ("host", "a")) and parsed.table == "points"
    assert q(metric="cpu", step="1m").table == "rollup_1m"
    assert q(metric="cpu", table="rollup_1m").table == "rollup_1m"
    rfc = q(metric="cpu", **{"from": "2026-11-21T10:00:00Z", "to": secs(H1.start_ns)})
    assert (rfc.from_ns, rfc.to_ns) == (H0.start_ns, H1.start_ns)
    assert q(metric="cpu", version="3").version == 3
    assert q(metric="cpu", as_of="2026-11-21T10:00:00Z").as_of is not None
    # A minute is in a rollup answer when it starts in [from, to).
    assert q(metric="cpu", step="1m", **{"from": secs(H0.start_ns + 1)}).points_range_ns[0] == (
        H0.start_ns + 60 * NS
    )


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({}, "metric"),
        ({"metric": "cpu", "bogus": "1"}, "bogus"),
        ({"metric": ["cpu", "mem"]}, "metric"),
        ({"metric": "cpu", "label": "nokv"}, "label"),
        ({"metric": "cpu", "label": ["a=1", "a=2"]}, "label"),
        ({"metric": "cpu", "from": "yesterday"}, "from"),
        ({"metric": "cpu", "from": secs(H1.start_ns), "to": secs(H0.start_ns)}, "from"),
        ({"metric": "cpu", "step": "5m"}, "step"),
        ({"metric": "cpu", "table": "points", "step": "1m"}, "step"),
        ({"metric": "cpu", "table": "ledger"}, "table"),
        ({"metric": "cpu", "version": "0"}, "version"),
        ({"metric": "cpu", "version": "1", "as_of": "2026-11-21T10:00:00Z"}, "version"),
        ({"metric": "x" * 257}, "metric"),
        ({"metric": "cpu", "agent": "a\x01"}, "agent"),
    ],
)
def test_parse_refuses_with_the_parameter_named(params: dict[str, Any], param: str) -> None:
    with pytest.raises(QueryError) as caught:
        q(**params)
    assert caught.value.status == 400
    assert caught.value.body()["error"] == "invalid_query"
    assert caught.value.body()["param"] == param


# --- frames and batches -----------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    body: bytes
    frame: Frame
    manifest: AcceptedManifest

    @property
    def manifest_id(self) -> str:
        return self.manifest.identity.manifest_id

    @property
    def ledger_row(self) -> LedgerRow:
        return LedgerRow.of_manifest(self.manifest)


def sent(
    rows: Sequence[tuple[int, str, float, dict[str, str] | None]],
    *,
    seq_start: int,
    accepted_ns: int,
    agent: str = "agent-a",
) -> Sent:
    table = points_table(
        [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows]
    )
    body = encode_frame(agent_id=agent, boot_id=BOOT, seq_start=seq_start, points=table)
    manifest = AcceptedManifest.of_frame(body, accepted_at_unix_ns=accepted_ns, collector_id="c1")
    return Sent(body, decode_frame(body), manifest)


def minute(m: int, s: int = 0) -> int:
    return H0.start_ns + (m * 60 + s) * NS


A, B = {"host": "a"}, {"host": "b"}
# b1, b2: committed in v1. b3: accepted in H1, live. b4: accepted in H0 (an hour the
# snapshot has) but not in it: excluded by manifest_id, never by hour. Ties on ts across
# batches exercise first/last ordering (ties broken by agent, boot, seq).
B1 = sent(
    [(minute(0, 1), "cpu", 1.0, A), (minute(0, 30), "cpu", 2.0, A), (minute(1, 5), "cpu", 3.0, B)],
    seq_start=0,
    accepted_ns=minute(2),
)
B2 = sent(
    [(minute(0, 30), "cpu", 7.0, A), (minute(1, 5), "cpu", float("nan"), B)],
    seq_start=3,
    accepted_ns=minute(3),
)
B3 = sent(
    [(minute(0, 1), "cpu", -4.0, A), (minute(1, 59), "cpu", 9.0, B), (minute(2), "mem", 1.0, A)],
    seq_start=5,
    accepted_ns=H1.start_ns + 5 * NS,
)
B4 = sent(
    [(minute(1, 5), "cpu", 11.0, B), (minute(0, 30), "cpu", 0.5, A)],
    seq_start=0,
    accepted_ns=minute(4),
    agent="agent-b",
)
ALL = (B1, B2, B3, B4)


async def commit(store: FileSystemStore, clock: ManualClock, batches: Sequence[Sent]) -> None:
    points = pa.concat_tables([points_rows(b.frame) for b in batches])
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    await commit_rows(
        store,
        owner,
        clock,
        data=[("points", H0, points), ("rollup_1m", H0, rollup_of_points(points))],
        ledger=[b.ledger_row for b in batches],
    )
    await owner.release()


async def completed_audit(store: FileSystemStore, started_ns: int) -> None:
    record = AuditRecord(
        audit_id="00000000000000a1",
        started_at_unix_ns=started_ns,
        completed_at_unix_ns=started_ns + NS,
        status="completed",
        owner_epoch=1,
        catalog=True,
    )
    await store.put(keys.audit_key(started_ns, record.audit_id), record.to_json())


@dataclass
class World:
    store: FileSystemStore
    clock: ManualClock
    window: LiveWindow
    endpoint: QueryEndpoint


@pytest.fixture
async def world(tmp_path: Path) -> World:
    clock = ManualClock(H1.start_ns + 10 * NS)
    store = FileSystemStore(tmp_path / "store", clock=clock)
    for b in ALL:
        await store.put(b.manifest.manifest_key, b.manifest.to_json())
    await catalog_manifests(store, [b.manifest for b in ALL], clock=clock)
    await commit(store, clock, [B1, B2])
    window = LiveWindow(window_s=7200, max_points=1000, max_bytes=1 << 30)
    for b in ALL:
        assert window.add(
            b.manifest_id, b.manifest.accepted_at_unix_ns, b.frame, now_ns=clock.now_ns()
        )
    endpoint = QueryEndpoint(
        authenticator=Authenticator(TOKENS),
        settings=QuerySettings(max_result_rows=50, history_wait_s=HISTORY_WAIT_S),
        snapshots=SnapshotSource(
            store, refresh_interval_s=0.0, max_travel_versions=100, monotonic=clock.monotonic
        ),
        coverage=Coverage(
            store,
            settle_margin_s=5,
            refresh_interval_s=0.0,
            monotonic=clock.monotonic,
            history_wait_s=HISTORY_WAIT_S,
        ),
        filesystem=lambda: arrow_filesystem(store.url),
        metrics=CollectorMetrics(),
        now_ns=clock.now_ns,
        window=window,
    )
    return World(store, clock, window, endpoint)


def oracle_points(batches: Sequence[Sent], metric: str = "cpu") -> pa.Table:
    rows = pa.concat_tables([points_rows(b.frame) for b in batches])
    rows = rows.filter(pa.compute.equal(rows["metric"], metric))
    return merge_points(rows.slice(0, 0), rows)


def query_ns(**params: str) -> LiveQuery:
    base = {"metric": "cpu", "from": secs(H0.start_ns), "to": secs(H1.start_ns)}
    return parse_query({k: [v] for k, v in {**base, **params}.items()}, now_ns=H1.start_ns)


async def test_points_answer_counts_every_batch_once(world: World) -> None:
    answer = await world.endpoint.answer(query_ns())
    assert answer["snapshot_version"] == 1
    assert answer["rows"] == json_rows(oracle_points(ALL))
    # 5 committed rows (b1, b2); b3's two cpu rows and b4's two are live.
    assert answer["sources"]["snapshot_rows"] == 5
    assert (answer["sources"]["live_rows"], answer["sources"]["live_batches"]) == (4, 2)
    assert answer["columns"][:4] == ["ts", "metric", "labels", "value"]
    json.dumps(answer, allow_nan=False)  # NaN is spelled as a string


async def test_rollup_shape_merges_committed_minutes_with_live_points(world: World) -> None:
    for params in ({"step": "1m"}, {"table": "rollup_1m"}):
        answer = await world.endpoint.answer(query_ns(**params))
        assert answer["rows"] == json_rows(rollup_of_points(oracle_points(ALL)))
    labelled = await world.endpoint.answer(query_ns(step="1m", label="host=b"))
    expected = oracle_points(ALL).filter(
        pa.compute.equal(oracle_points(ALL)["series"], 'cpu{host="b"}')
    )
    assert labelled["rows"] == json_rows(rollup_of_points(expected))
    by_agent = await world.endpoint.answer(query_ns(step="1m", agent="agent-b"))
    assert by_agent["rows"] == json_rows(rollup_of_points(oracle_points([B4])))


async def test_complete_only_where_sealed_and_covered(world: World) -> None:
    # No audit: nothing is sealed.
    answer = await world.endpoint.answer(query_ns())
    assert (answer["complete"], answer["sealed_through_ns"]) == (False, 0)
    # An audit seals H0 and H1, but H0's catalog has b4, which v1 lacks.
    await completed_audit(world.store, H1.next().start_ns + 60 * NS)
    answer = await world.endpoint.answer(query_ns())
    assert answer["sealed_through_ns"] == H0.start_ns and not answer["complete"]
    early = await world.endpoint.answer(
        query_ns(**{"from": secs(H0.start_ns - 3600 * NS), "to": secs(H0.start_ns)})
    )
    assert early["complete"] and early["rows"] == []
    # v2 includes b3 and b4: both hours covered; the live part is now empty.
    await commit(world.store, world.clock, [B3, B4])
    answer = await world.endpoint.answer(query_ns())
    assert answer["sealed_through_ns"] == H1.next().start_ns and answer["complete"]
    assert answer["snapshot_version"] == 2 and answer["sources"]["live_rows"] == 0
    assert answer["rows"] == json_rows(oracle_points(ALL))


async def test_running_or_inventory_audits_seal_nothing(world: World) -> None:
    started = H1.next().start_ns + 60 * NS
    for audit_id, fields in (
        ("00000000000000b1", {"status": "running"}),
        ("00000000000000b2", {"status": "completed", "source": "inventory"}),
    ):
        record = AuditRecord(
            audit_id=audit_id, started_at_unix_ns=started, owner_epoch=1, catalog=True, **fields
        )
        await world.store.put(keys.audit_key(started, audit_id), record.to_json())
    assert (await world.endpoint.answer(query_ns()))["sealed_through_ns"] == 0


async def test_time_travel_reads_the_committed_part_only(world: World) -> None:
    await commit(world.store, world.clock, [B3, B4])
    answer = await world.endpoint.answer(query_ns(version="1"))
    assert answer["snapshot_version"] == 1 and answer["sources"]["live_rows"] == 0
    assert answer["rows"] == json_rows(oracle_points([B1, B2]))
    with pytest.raises(Exception, match="version"):
        await world.endpoint.answer(query_ns(version="9"))


async def test_too_many_rows(world: World) -> None:
    world.endpoint.settings = QuerySettings(max_result_rows=3)
    with pytest.raises(QueryError) as caught:
        await world.endpoint.answer(query_ns())
    assert (caught.value.status, caught.value.error) == (400, "too_many_rows")


async def test_evicted_batches_make_answers_incomplete(world: World) -> None:
    await completed_audit(world.store, H1.next().start_ns + 60 * NS)
    await commit(world.store, world.clock, [B3, B4])
    window = LiveWindow(window_s=7200, max_points=3, max_bytes=1 << 30)
    # Accepted after sealed_through (H2) and carrying old points.
    late = sent([(minute(5), "cpu", 1.0, A)] * 3, seq_start=100, accepted_ns=H1.next().start_ns)
    for b in (B3, late):
        window.add(
            b.manifest_id, b.manifest.accepted_at_unix_ns, b.frame, now_ns=world.clock.now_ns()
        )
    assert B3.manifest_id not in window and window.point_count == 3
    world.endpoint.window = window
    # B3 was evicted but v2 holds it: nothing is missing.
    answer = await world.endpoint.answer(query_ns())
    assert answer["complete"] and answer["sources"]["dropped_missing"] == 0
    window.add("x", H1.next().start_ns, B1.frame, now_ns=world.clock.now_ns())  # evicts `late`
    answer = await world.endpoint.answer(query_ns())
    assert answer["sources"]["dropped_missing"] == 1 and not answer["complete"]


# --- window and coverage, pure ----------------------------------------------------------


def test_window_evicts_oldest_and_expires_by_accepted_time() -> None:
    window = LiveWindow(window_s=100, max_points=5, max_bytes=1 << 30, max_dropped=1)
    now = 1_000 * NS
    assert window.add("m1", now - 10 * NS, B1.frame, now_ns=now)  # 3 points
    assert not window.add("m1", now - 10 * NS, B1.frame, now_ns=now)
    assert not window.add("old", now - 200 * NS, B1.frame, now_ns=now)
    assert window.add("m2", now - 5 * NS, B2.frame, now_ns=now)  # 2 points: 5 in all
    assert window.add("m3", now - 1 * NS, B2.frame, now_ns=now)  # evicts m1
    assert [b.manifest_id for b in window.batches()] == ["m2", "m3"] and window.point_count == 4
    window.expire(now + 97 * NS)  # m2 out of the window; m1 forgotten (max_dropped 1)
    assert [b.manifest_id for b in window.batches()] == ["m3"]
    assert [d.manifest_id for d in window.dropped()] == ["m2"]
    assert window.forgotten_through_ns == now - 10 * NS
    ranges = (minute(0), minute(10))
    missing = missing_dropped(
        window.dropped(), window.forgotten_through_ns, set(), sealed_through_ns=0, range_ns=ranges
    )
    assert missing == 2
    assert (
        missing_dropped(window.dropped(), None, {"m2"}, sealed_through_ns=0, range_ns=ranges) == 0
    )
    window.forget_committed(now)
    assert window.dropped() == [] and window.forgotten_through_ns is None


def test_sealed_limit_and_first_uncovered_hour() -> None:
    assert sealed_limit_ns(None, 5 * NS) == 0
    assert sealed_limit_ns(H1.start_ns + 4 * NS, 5 * NS) == H0.start_ns
    assert sealed_limit_ns(H1.start_ns + 5 * NS, 5 * NS) == H1.start_ns
    totals = {H0.iso: LedgerHour(2, 5, "ab" * 32)}
    assert first_uncovered_ns(None, totals, H1.next().start_ns) == H0.start_ns
    assert first_uncovered_ns(None, totals, H0.start_ns) == H0.start_ns
    assert first_uncovered_ns(None, {}, H1.start_ns) == H1.start_ns


# --- HTTP: auth before anything ---------------------------------------------------------


async def test_auth_before_any_work(world: World) -> None:
    def request(token: str | None, query: str = "metric=cpu") -> Any:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return make_mocked_request("GET", f"/v1/query?{query}", headers=headers)

    assert (await world.endpoint.get_query(request(None))).status == 401
    assert (await world.endpoint.get_query(request("wrong"))).status == 401
    forbidden = await world.endpoint.get_query(request(WRITE_TOKEN, "bogus=1"))
    assert forbidden.status == 403  # before the parameters are even looked at
    bad = await world.endpoint.get_query(request(READ_TOKEN, "metric=cpu&step=5m"))
    assert bad.status == 400 and json.loads(bad.body)["param"] == "step"
    missing = await world.endpoint.get_query(request(READ_TOKEN, "metric=cpu&version=7"))
    assert missing.status == 404 and json.loads(missing.body)["error"] == "version_not_found"
    ok = await world.endpoint.get_query(request(READ_TOKEN))
    assert ok.status == 200 and json.loads(ok.body)["snapshot_version"] == 1
    world.endpoint._running = world.endpoint.settings.max_concurrent_queries
    assert (await world.endpoint.get_query(request(READ_TOKEN))).status == 429


# --- the designated follower and start-up ----------------------------------------------


async def test_follower_rebuilds_from_the_log_checks_blobs_and_bounds_pending(
    tmp_path: Path,
) -> None:
    import random

    from collector.query.sources import LogFollower
    from index.log_writer import IndexLogWriter
    from index.rows import accepted_row

    clock = ManualClock(H1.start_ns + 30 * NS)
    store = FileSystemStore(tmp_path / "store", clock=clock)
    writer = IndexLogWriter(store=store, clock=clock, rng=random.Random(1), writer_id="c1")
    for b in ALL:
        writer.append(accepted_row(b.manifest))
        await writer.flush()  # one segment each
        clock.advance(1)
    for b in (B1, B2, B4):  # B3's blob is missing; B4's holds other bytes
        await store.put(b.manifest.raw_blob_key, B1.body if b is B4 else b.body)

    def follower(window: LiveWindow, max_pending: int) -> LogFollower:
        return LogFollower(
            store, window, clock=clock, poll_interval_s=1, lookback_s=5,
            max_pending=max_pending, max_raw_bytes=1 << 20,
        )  # fmt: skip

    window = LiveWindow(window_s=7200, max_points=1000, max_bytes=1 << 30)
    small = follower(window, max_pending=1)
    await small.poll_once()  # one segment's batch fits; the next would pass the bound
    assert (
        small.behind
        and not small.ready
        and [b.manifest_id for b in window.batches()] == [B1.manifest_id]
    )
    for _ in range(3):
        await small.poll_once()
    assert small.ready and not small.behind
    assert small.followed_through_ns == clock.now_ns() - 5 * NS
    assert [b.manifest_id for b in window.batches()] == [B1.manifest_id, B2.manifest_id]
    assert {d.manifest_id for d in window.dropped()} == {B3.manifest_id, B4.manifest_id}

    # A fresh follower (a restarted collector) starts window_s back and finds them again.
    rebuilt = LiveWindow(window_s=7200, max_points=1000, max_bytes=1 << 30)
    await follower(rebuilt, max_pending=100).poll_once()
    assert [b.manifest_id for b in rebuilt.batches()] == [B1.manifest_id, B2.manifest_id]
    # ...but not batches accepted before the window.
    short = LiveWindow(window_s=3000, max_points=1000, max_bytes=1 << 30)  # from H0 + 634 s
    await follower(short, max_pending=100).poll_once()
    assert short.batches() == [] and [d.manifest_id for d in short.dropped()] == [B3.manifest_id]


async def _window_after_one_poll(store: ObjectStore, clock: ManualClock) -> LiveWindow:
    """A live window after one poll of a follower of ``store``'s log (bundled frames up to
    1 MiB)."""
    from collector.query.sources import LogFollower

    window = LiveWindow(window_s=7200, max_points=1000, max_bytes=1 << 30)
    follower = LogFollower(
        store, window, clock=clock, poll_interval_s=1, lookback_s=5,
        max_pending=100, max_raw_bytes=1 << 20, max_frame_bytes=1 << 20,
    )  # fmt: skip
    await follower.poll_once()
    return window


async def test_follower_reads_a_bundled_frame_by_its_range(tmp_path: Path) -> None:
    """PROTOCOL §3.10: a log row naming a bundle and a range; the frame is read by its
    range (one ranged GET) and held; a row whose range its bundle cannot serve (its hash
    is not in the bundle) is lost to the window, so answers needing it are partial."""
    from index.log_writer import IndexLogWriter
    from protocol.bundle import encode_bundle
    from store.counting import CountingStore

    clock = ManualClock(H1.start_ns + 30 * NS)
    inner = FileSystemStore(tmp_path / "store", clock=clock)
    bundle = encode_bundle([B1.body, B2.body])
    await inner.put(bundle.key, bundle.data)
    writer = IndexLogWriter(store=inner, clock=clock, rng=random.Random(1), writer_id="c1")
    for b, entry in ((B1, bundle.entries[0]), (B3, bundle.entries[1])):
        bundled = AcceptedManifest.of_frame(
            b.body,
            accepted_at_unix_ns=b.manifest.accepted_at_unix_ns,
            collector_id="c1",
            bundle=(bundle.key, entry.offset),
        )
        row = accepted_row(bundled)
        if b is B3:  # B3's row names B2's range (and B3's hash): the bundle has no B3
            row = dataclasses.replace(row, raw_length=entry.length, frame_bytes=entry.length)
        writer.append(row)
    await writer.flush()
    store = CountingStore(inner)
    window = await _window_after_one_poll(store, clock)
    assert [b.manifest_id for b in window.batches()] == [B1.manifest_id]
    assert [d.manifest_id for d in window.dropped()] == [B3.manifest_id]
    held = window.batches()[0]
    assert held.frame_sha256 == B1.manifest.frame_sha256
    # B1 and B3's ranges: one ranged GET for both (one poll shares a bundle's span). B3:
    # then HEAD + the bundle's tail, no entry of its hash: bad-range.
    assert store.keys_of("get", "raw-bundles/") == [bundle.key] * 2
    assert store.keys_of("head", "raw-bundles/") == [bundle.key]


async def test_one_poll_reads_a_bundles_frames_with_one_get(tmp_path: Path) -> None:
    """The follower's GETs per batch with bundles: the frames of one bundle found in one
    poll are read with one (coalesced) ranged GET, not one each; two collectors' bundles
    interleaved in time are read one after the other (a span held for its rows only)."""
    from collector.query.sources import SharedSpans
    from index.log_writer import IndexLogWriter
    from protocol.bundle import encode_bundle
    from store.counting import CountingStore

    clock = ManualClock(H1.start_ns + 30 * NS)
    inner = FileSystemStore(tmp_path / "store", clock=clock)
    frames = [
        sent([(minute(0, i), "cpu", float(i), A)], seq_start=100 + i, accepted_ns=minute(5))
        for i in range(20)
    ]
    bundles = [encode_bundle([f.body for f in frames[k::2]]) for k in (0, 1)]
    writer = IndexLogWriter(store=inner, clock=clock, rng=random.Random(1), writer_id="c1")
    rows = []
    for i, f in enumerate(frames):  # accepted alternately from the two bundles
        bundle = bundles[i % 2]
        manifest = AcceptedManifest.of_frame(
            f.body,
            accepted_at_unix_ns=minute(5) + i,
            collector_id="c1",
            bundle=(bundle.key, bundle.entries[i // 2].offset),
        )
        rows.append(accepted_row(manifest))
        writer.append(rows[-1])
    for bundle in bundles:
        await inner.put(bundle.key, bundle.data)
    await writer.flush()
    order = SharedSpans(inner, rows).together(rows)
    assert [r.raw_blob_key for r in order] == [bundles[0].key] * 10 + [bundles[1].key] * 10
    store = CountingStore(inner)
    window = await _window_after_one_poll(store, clock)
    assert sorted(b.manifest_id for b in window.batches()) == sorted(f.manifest_id for f in frames)
    assert window.dropped() == []
    assert store.keys_of("get", "raw-") == [bundles[0].key, bundles[1].key]  # 1/10 per batch


async def test_designated_answers_503_until_the_window_is_rebuilt(world: World) -> None:
    class NotReady:
        ready = False
        behind = False
        followed_through_ns = 0

    world.endpoint.follower = NotReady()  # type: ignore[assignment]
    request = make_mocked_request(
        "GET", "/v1/query?metric=cpu", headers={"Authorization": f"Bearer {READ_TOKEN}"}
    )
    answer = await world.endpoint.get_query(request)
    assert answer.status == 503 and json.loads(answer.body)["error"] == "window_not_ready"
    assert answer.headers["Retry-After"] == "1"


def test_designated_refuses_more_than_one_worker() -> None:
    from collector.server import StartupError, check_startup
    from config import Settings

    settings = Settings.model_validate({"query": {"designated": True}})
    with pytest.raises(StartupError, match=r"query\.designated"):
        check_startup(settings, workers=2)
    check_startup(settings, workers=1)


async def test_coverage_lists_a_long_history_a_bounded_number_of_hours_at_a_time(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history reader lists at most `MAX_HOURS_PER_LISTING` hours at a time and goes
    on listing until it has read every sealed hour."""
    import collector.query.coverage as coverage_module
    from store.counting import CountingStore

    monkeypatch.setattr(coverage_module, "MAX_HOURS_PER_LISTING", 1)
    counting = CountingStore(world.store)
    world.endpoint.coverage = Coverage(
        counting, settle_margin_s=5, refresh_interval_s=0.0, history_wait_s=HISTORY_WAIT_S
    )
    await completed_audit(world.store, H1.next().start_ns + 60 * NS)
    await commit(world.store, world.clock, [B3, B4])
    answer = await world.endpoint.answer(query_ns(to=secs(H1.next().start_ns)))
    assert answer["sealed_through_ns"] == H1.next().start_ns and answer["complete"]
    catalog_listings = [p for p, _ in counting.lists if p == keys.INDEX_CATALOG_PREFIX]
    assert len(catalog_listings) == 2  # H0 (stopping at H1), then H1 through the limit


async def test_cli_url_and_table(world: World) -> None:
    import io

    from collector.__main__ import build_parser
    from collector.query.cli import print_answer, query_url

    args = build_parser().parse_args(
        ["query", "--url", "http://127.0.0.1:9/", "--metric", "cpu", "--label", "host=a",
         "--from", "2026-11-21T10:00:00Z", "--step", "1m", "--version", "1"]
    )  # fmt: skip
    assert query_url(args) == (
        "http://127.0.0.1:9/v1/query?metric=cpu&label=host%3Da"
        "&from=2026-11-21T10%3A00%3A00Z&step=1m&version=1"
    )
    out = io.StringIO()
    print_answer(await world.endpoint.answer(query_ns(step="1m")), "table", out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("complete=false snapshot_version=1 ")
    assert lines[1].split()[:3] == ["window_start", "series", "metric"]
    assert len(lines) == 2 + 2  # cpu{host="a"} in minute 0, cpu{host="b"} in minute 1


async def test_deletes_mask_committed_and_live_rows(world: World) -> None:
    from datetime import UTC, datetime

    from rollup.table.commit import commit as commit_snapshot
    from rollup.table.commit import load_latest
    from rollup.table.manifest import Changes
    from rollup.table.tombstones import Tombstone

    delete = Tombstone(
        id=str(uuid.UUID(int=7)),
        metric="cpu",
        labels=(("host", "b"),),
        end=datetime(2030, 1, 1, tzinfo=UTC),
        tables=("points", "rollup_1m"),
        requested_by="test",
        reason="a bad sensor",
        created_at="2026-11-21T11:00:00Z",
    )
    owner = await OwnerLease.acquire(world.store, "job", 600, world.clock)
    base = await load_latest(world.store)
    await commit_snapshot(
        world.store,
        base=base,
        changes=Changes(added_tombstones=(delete,)),
        owner=owner,
        clock=world.clock,
    )
    await owner.release()
    kept = oracle_points(ALL).filter(
        pa.compute.equal(oracle_points(ALL)["series"], 'cpu{host="a"}')
    )
    answer = await world.endpoint.answer(query_ns())
    assert answer["snapshot_version"] == 2 and answer["rows"] == json_rows(kept)
    minutes = await world.endpoint.answer(query_ns(step="1m"))
    assert minutes["rows"] == json_rows(rollup_of_points(kept))
    # Version 1 has no delete yet: time travel still shows the committed rows.
    before = await world.endpoint.answer(query_ns(version="1"))
    assert before["rows"] == json_rows(oracle_points([B1, B2]))


async def test_a_designated_collector_behind_the_log_is_never_complete(world: World) -> None:
    class Behind:
        ready = True
        behind = True
        followed_through_ns = H1.start_ns + 3 * NS

    await completed_audit(world.store, H1.next().start_ns + 60 * NS)
    await commit(world.store, world.clock, [B3, B4])
    assert (await world.endpoint.answer(query_ns()))["complete"]
    world.endpoint.follower = Behind()  # type: ignore[assignment]
    answer = await world.endpoint.answer(query_ns())
    assert not answer["complete"] and answer["live_through_ns"] == H1.start_ns + 3 * NS
    assert answer["sources"]["following"] == "designated"


async def test_rollup_shape_when_the_committed_tied_point_is_gone(world: World) -> None:
    """Issue 24 item 5: b1's points left the points table (a delete by agent and then
    compaction, or points retention shorter than rollup_1m's) while rollup_1m keeps its
    minutes; b3 (live) ties b1's first sample of minute 0 on ts. The answer is 200 with
    the committed sample kept (before: ValueError, an HTTP 500)."""
    clock = world.clock
    owner = await OwnerLease.acquire(world.store, "job", 600, clock)
    b1_b2 = pa.concat_tables([points_rows(b.frame) for b in (B1, B2)])
    await commit_rows(
        world.store,
        owner,
        clock,
        data=[("rollup_1m", H0, rollup_of_points(b1_b2)), ("points", H0, points_rows(B2.frame))],
        remove=[f.path for f in (await _latest(world.store)).data_files("points")]
        + [f.path for f in (await _latest(world.store)).data_files("rollup_1m")],
    )
    await owner.release()
    request = make_mocked_request(
        "GET",
        f"/v1/query?metric=cpu&step=1m&from={H0.start_ns // NS}&to={H1.start_ns // NS}",
        headers={"Authorization": f"Bearer {READ_TOKEN}"},
    )
    response = await world.endpoint.get_query(request)
    assert response.status == 200, response.body
    answer = json.loads(response.body)
    assert answer["snapshot_version"] == 2
    # b1 (seq 0) precedes b3 (seq 5) of the same agent and boot: the committed first stays.
    assert answer["rows"] == json_rows(rollup_of_points(oracle_points(ALL)))


async def _latest(store: FileSystemStore) -> Any:
    from rollup.table.commit import load_latest

    loaded = await load_latest(store)
    assert loaded is not None
    return loaded.snapshot


async def test_a_new_catalog_file_in_a_sealed_hour_is_read_again_without_a_restart(
    world: World,
) -> None:
    """PROTOCOL §3.7: a reader caching an hour's totals re-reads the hour when a
    ``catalog-created`` entry names a new file in it (a retraction's ``retracted`` row)."""
    await completed_audit(world.store, H1.next().start_ns + 60 * NS)
    await commit(world.store, world.clock, [B3, B4])
    assert (await world.endpoint.answer(query_ns()))["sealed_through_ns"] == H1.next().start_ns
    # B4 retracted (say it was a phantom): its hour's catalog no longer counts it, while
    # the snapshot's ledger still includes it (until the rollup removes it).
    retracted = dataclasses.replace(accepted_row(B4.manifest), kind="retracted")
    writer = CatalogWriter(store=world.store, clock=world.clock, rng=random.Random(5), epoch=9)
    await writer.write(retracted.hour, [retracted], writer="audit-00000000000000a2")
    answer = await world.endpoint.answer(query_ns())
    assert answer["sealed_through_ns"] == retracted.hour.start_ns and not answer["complete"]


async def test_no_catalog_created_entry_is_read_while_no_hour_is_cached(world: World) -> None:
    """With no sealed hour cached there is nothing to read again: new ``catalog-created``
    entries are listed (the position moves on) but not read; once hours are cached, only
    the entries created after that are read."""
    from store.counting import CountingStore

    counting = CountingStore(world.store)
    coverage = Coverage(
        counting,
        settle_margin_s=5,
        refresh_interval_s=0.0,
        monotonic=world.clock.monotonic,
        history_wait_s=HISTORY_WAIT_S,
    )
    snapshot = await _latest(world.store)
    entries = keys.INDEX_CATALOG_CREATED_PREFIX
    writer = CatalogWriter(store=world.store, clock=world.clock, rng=random.Random(6), epoch=9)
    b4_row = accepted_row(B4.manifest)  # an audit's superseding row: the same record again

    assert await coverage.sealed_through_ns(snapshot) == 0  # no audit: nothing cached
    await writer.write(b4_row.hour, [b4_row], writer="audit-00000000000000a2")
    assert await coverage.sealed_through_ns(snapshot) == 0
    await completed_audit(world.store, H1.next().start_ns + 60 * NS)
    await commit(world.store, world.clock, [B3, B4])
    snapshot = await _latest(world.store)
    assert await coverage.sealed_through_ns(snapshot) == H1.next().start_ns  # read afresh
    assert counting.count("get", entries) == 0 and counting.count("list", entries) == 3

    await writer.write(b4_row.hour, [b4_row], writer="audit-00000000000000a2")
    assert await coverage.sealed_through_ns(snapshot) == H1.next().start_ns
    assert len(counting.keys_of("get", entries)) == 1  # the new entry only
