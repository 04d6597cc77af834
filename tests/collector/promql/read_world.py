"""A remote-read world for the tests (a helper, not tests): a committed snapshot (Parquet
written with pyarrow, committed through `rollup.table.commit`, no Spark) on a filesystem
store, a live window holding batches the snapshot lacks, and an oracle written per
sample in plain Python (the series model of PROTOCOL §5, independent of
`collector.promql.select`).

Batches: B1, B2 committed (v1, hour H0); B3 accepted in H1 and B4 accepted in H0, both
live (not in the ledger; B4 is excluded by ``manifest_id``, never by hour); B2 is also
held by the window (committed: it must not count twice). They hold

- ``cpu{host=a|b}``: a microsecond tie inside one millisecond, split between the
  committed and the live part; two agents at one microsecond (agent order decides);
- ``http.server.duration{le="1"}`` and ``http_server_duration{le="1"}``: two stored
  series presenting one label set, colliding at one millisecond;
- ``temp{a.b="x", a_b="y"}``: a stored label dropped for a name clash;
- a staleness marker (its NaN bits must survive).
"""

from __future__ import annotations

import io
import re
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from collector.auth import Authenticator
from collector.metrics import CollectorMetrics
from collector.promql.read_endpoint import ReadEndpoint
from collector.query.committed import SnapshotSource
from collector.query.window import LiveWindow
from config import Principal, TokenTable, hash_token
from config.settings import QuerySettings
from protocol import keys
from protocol.clock import ManualClock
from protocol.frame import Frame, decode_frame
from protocol.frame_encode import encode_frame, points_table
from protocol.prom_names import present_labels
from protocol.records import AcceptedManifest
from rollup.table.commit import commit as commit_snapshot
from rollup.table.commit import load_latest
from rollup.table.data_file import DataFile, describe_file
from rollup.table.ledger import LedgerRow, write_ledger_files
from rollup.table.manifest import Changes
from rollup.table.owner import OwnerLease
from rollup.table.points import points_rows
from rollup.table.series_rows import hour_counts, series_table
from rollup.table.storage import arrow_filesystem
from store.fs import FileSystemStore

NS = 1_000_000_000
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
STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
LabelSet = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sent:
    frame: Frame
    manifest: AcceptedManifest

    @property
    def manifest_id(self) -> str:
        return self.manifest.identity.manifest_id


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
    return Sent(decode_frame(body), manifest)


def at(second: int, us: int = 0) -> int:
    """H0 + ``second`` s + ``us`` µs, in ns."""
    return H0.start_ns + second * NS + us * 1000


A, B = {"host": "a"}, {"host": "b"}
LE = {"le": "1"}
B1 = sent(
    [
        (at(1), "cpu", 1.0, A),
        (at(2, 100), "cpu", 2.0, A),  # one ms with B3's at(2, 900): B3 wins (later µs)
        (at(3), "cpu", 3.0, B),
        (at(5), "http.server.duration", 10.0, LE),
        (at(6), "temp", 20.0, {"a.b": "x", "a_b": "y"}),
    ],
    seq_start=0,
    accepted_ns=at(60),
)
B2 = sent(
    [
        (at(4), "cpu", 4.0, A),
        (at(5), "http_server_duration", 11.0, LE),  # collides with B1's: "http.s" < "http_s"
        (at(7), "http_server_duration", 12.0, LE),
        (at(8), "cpu", STALE_NAN, A),
    ],
    seq_start=5,
    accepted_ns=at(120),
)
B3 = sent(
    [
        (at(2, 900), "cpu", -2.0, A),
        (at(9), "cpu", 9.0, B),
        (at(10), "mem", 1.0, A),
    ],
    seq_start=9,
    accepted_ns=H1.start_ns + 5 * NS,
)
B4 = sent(
    [(at(9), "cpu", 99.0, B), (at(11), "cpu", 11.0, A)],  # at(9) host=b: ties B3 at one µs
    seq_start=0,
    accepted_ns=at(180),
    agent="agent-0",  # sorts before agent-a: B3's point wins the tie
)
COMMITTED, LIVE = (B1, B2), (B2, B3, B4)
ALL = (B1, B2, B3, B4)


@dataclass
class World:
    store: FileSystemStore
    clock: ManualClock
    window: LiveWindow
    endpoint: ReadEndpoint
    batches: tuple[Sent, ...]  # every batch whose points the world holds (the oracle's input)


async def commit(
    store: FileSystemStore,
    clock: ManualClock,
    batches: Sequence[Sent],
    *,
    extra: pa.Table | None = None,
    row_group_size: int | None = None,
    series: bool = False,
) -> None:
    """Commit ``batches`` (and ``extra`` points rows) as one ``points`` file of H0,
    sorted by series then time, in row groups of ``row_group_size`` rows; ``series``:
    with its ``series`` index file, as the rollup writes it in the same commit."""
    points = pa.concat_tables([points_rows(b.frame) for b in batches])
    if extra is not None:
        points = pa.concat_tables([points, extra])
    points = points.sort_by([("series", "ascending"), ("ts", "ascending")])
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    base = await load_latest(store)
    version = base.snapshot.version + 1 if base is not None else 1
    key = keys.rollup_data_key("points", H0, str(uuid.uuid4()))
    sink = io.BytesIO()
    pq.write_table(points, sink, row_group_size=row_group_size or points.num_rows)
    await store.put(key, sink.getvalue())
    added = describe_file(
        "points", key, H0, points, size_bytes=len(sink.getvalue()), added_version=version
    )
    files = [added]
    if series:
        files.append(
            await put_file(store, "series", H0, series_table(hour_counts(points)), version)
        )
    ledger = await write_ledger_files(store, [LedgerRow.of_manifest(b.manifest) for b in batches])
    changes = Changes(
        added_files=tuple(files),
        added_ledger_files=ledger.added_ledger_files,
        ledger_delta=ledger.ledger_delta,
    )
    await commit_snapshot(store, base=base, changes=changes, owner=owner, clock=clock)
    await owner.release()


async def put_file(
    store: FileSystemStore,
    table: str,
    hour: keys.UtcHour,
    rows: pa.Table,
    version: int,
    row_group_size: int | None = None,
) -> DataFile:
    """Write ``rows`` as one Parquet file of ``table`` in ``hour``: its `DataFile`."""
    key = keys.rollup_data_key(table, hour, str(uuid.uuid4()))
    sink = io.BytesIO()
    pq.write_table(rows, sink, row_group_size=row_group_size or max(1, rows.num_rows))
    await store.put(key, sink.getvalue())
    return describe_file(
        table, key, hour, rows, size_bytes=len(sink.getvalue()), added_version=version
    )


def filler(count: int) -> Sent:
    """A batch of ``count`` points of ``fill``, one a millisecond, committed as extra rows
    (never in the ledger or the window)."""
    rows = [(at(100) + i * 1_000_000, "fill", 0.5, None) for i in range(count)]
    return sent(rows, seq_start=0, accepted_ns=at(100), agent="filler")


async def make_world(
    tmp_path: Path, *, fill: int = 0, series: bool = False, **settings: int
) -> World:
    """The world; ``fill``: that many more committed points (metric ``fill``), in row
    groups of 100 rows; ``series``: the committed hour with its series index file."""
    clock = ManualClock(H1.start_ns + 10 * NS)
    store = FileSystemStore(tmp_path / "store", clock=clock)
    extra = filler(fill) if fill else None
    if extra is not None:
        await commit(
            store,
            clock,
            COMMITTED,
            extra=points_rows(extra.frame),
            row_group_size=100,
            series=series,
        )
    else:
        await commit(store, clock, COMMITTED, series=series)
    window = LiveWindow(window_s=7200, max_points=1000, max_bytes=1 << 30)
    for b in LIVE:
        assert window.add(
            b.manifest_id, b.manifest.accepted_at_unix_ns, b.frame, now_ns=clock.now_ns()
        )
    endpoint = ReadEndpoint(
        authenticator=Authenticator(TOKENS),
        settings=QuerySettings(**settings),
        snapshots=SnapshotSource(
            store, refresh_interval_s=0.0, max_travel_versions=100, monotonic=clock.monotonic
        ),
        filesystem=lambda: arrow_filesystem(store.url),
        metrics=CollectorMetrics(),
        now_ns=clock.now_ns,
        window=window,
    )
    return World(store, clock, window, endpoint, (*ALL, extra) if extra else ALL)


# --- the oracle ---------------------------------------------------------------------------

Matcher = tuple[str, str, str]  # (kind, name, value)


def _matches(label_set: LabelSet, matcher: Matcher) -> bool:
    kind, name, value = matcher
    have = dict(label_set).get(name, "")
    if kind == "EQ":
        return have == value
    if kind == "NEQ":
        return have != value
    found = re.fullmatch(f"(?:{value})", have) is not None  # fixed test patterns only
    return found if kind == "RE" else not found


def bits(value: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", value))[0])


def oracle(
    batches: Sequence[Sent],
    matchers: Sequence[Matcher],
    start_ms: int,
    end_ms: int,
    deleted: Sequence[tuple[str, LabelSet]] = (),
) -> list[tuple[LabelSet, list[tuple[int, int]]]]:
    """The expected answer, one sample at a time: [(label set, [(ms, value bits)])]
    in Prometheus' order. ``deleted``: (metric, stored labels) masked everywhere."""
    best: dict[tuple[str, int], tuple[tuple[int, str, str, int], LabelSet, float]] = {}
    for batch in batches:
        rows = points_rows(batch.frame).to_pylist()
        for row in rows:
            labels = dict(row["labels"] or [])
            if (row["metric"], tuple(sorted(labels.items()))) in deleted:
                continue
            ts = row["ts"]
            micro = int(ts.timestamp()) * 1_000_000 + ts.microsecond
            ms = micro // 1000
            if not start_ms <= ms <= end_ms:
                continue
            presented, _ = present_labels(row["metric"], labels)
            if not all(_matches(presented, m) for m in matchers):
                continue
            key = (row["series"], ms)
            rank = (micro, row["agent_id"], row["boot_id"], row["seq"])
            if key not in best or rank > best[key][0]:
                best[key] = (rank, presented, row["value"])
    merged: dict[tuple[LabelSet, int], tuple[bytes, float]] = {}
    for (stored, ms), (_rank, presented, value) in best.items():
        key2 = (presented, ms)
        if key2 not in merged or stored.encode() < merged[key2][0]:
            merged[key2] = (stored.encode(), value)
    out: dict[LabelSet, list[tuple[int, int]]] = {}
    for (presented, ms), (_stored, value) in sorted(merged.items(), key=lambda kv: kv[0][1]):
        out.setdefault(presented, []).append((ms, bits(value)))
    order = sorted(out, key=lambda s: tuple((n.encode(), v.encode()) for n, v in s))
    return [(s, out[s]) for s in order]
