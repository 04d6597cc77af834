"""The audit's out-of-core joins (`reconciler.audit.engines.duckdb_joins`, `reconciler.audit.engines.sql`): listing
parts and pinned catalog files in, records to read, phantom candidates, orphans and
missing-blob candidates out, each difference found exactly (issue 23 item 2)."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from index.rows import IndexRow, encode
from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.audit_inputs import PinnedFileMissing, fetch_catalog
from reconciler.audit.engines import sql as audit_sql
from reconciler.audit.engines.duckdb_joins import AuditJoins, JoinLimits, iter_batches
from reconciler.audit.retired import settle_retired
from reconciler.gc.raw_retention import Retired
from reconciler.problems import ProblemBook
from rollup.table.manifest import LedgerHour
from store.memory import MemoryStore
from tests.reconciler.conftest import context

LISTING_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("etag", pa.string()),
        ("size", pa.int64()),
        ("last_modified", pa.timestamp("us", tz="UTC")),
    ]
)
HOUR_NS = 3600 * keys.NS_PER_S
T0 = 1_760_000_000 // 3600 * HOUR_NS  # an hour's start
START = T0 + 10 * HOUR_NS  # the audit's start
MARGIN = 60 * keys.NS_PER_S
HORIZON = 3600 * keys.NS_PER_S
BOOT = "0" * 31 + "1"


def sha(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def mkey(n: int) -> str:
    return f"accepted/v1/agent=a{n % 3}/boot={BOOT}/{n * 10:020d}-{n * 10 + 9:020d}.json"


def qkey(n: int, submitted: str) -> str:
    return (
        f"quarantine/v1/identity-conflict/agent=a{n % 3}/boot={BOOT}/"
        f"{n * 10:020d}-{n * 10 + 9:020d}/{submitted}.json"
    )


def row(n: int, *, hour: int = 0, etag: str | None = None, frame: str | None = None) -> IndexRow:
    frame = frame or sha(n)
    return IndexRow(
        "accepted",
        mkey(n),
        frame,
        T0 + hour * HOUR_NS + n,
        raw_blob_key=keys.raw_blob_key(frame),
        etag=etag if etag is not None else f'"e{n}"',
    )


def write_part(path: Path, entries: list[tuple[str, str | None, int]], *, size: int = 100) -> str:
    """``(key, etag, last_modified_ns)`` as a listing part (every object of ``size``)."""
    pq.write_table(
        pa.table(
            {
                "key": [k for k, _e, _t in entries],
                "etag": [e for _k, e, _t in entries],
                "size": [size] * len(entries),
                "last_modified": pa.array([t // 1000 for _k, _e, t in entries], pa.int64()).cast(
                    pa.timestamp("us", tz="UTC")
                ),
            },
            schema=LISTING_SCHEMA,
        ),
        path,
    )
    return str(path)


def blob_entry(s: str, modified_ns: int = T0) -> tuple[str, str | None, int]:
    return (keys.raw_blob_key(s), '"b"', modified_ns)


async def put_catalog(
    store: MemoryStore, hour: int, epoch: int, seq: int, rows: list[IndexRow]
) -> str:
    name = keys.index_catalog_key(keys.UtcHour.from_unix_ns(T0 + hour * HOUR_NS), epoch, seq)
    await store.put(name, encode(rows))
    return name


LIMITS = JoinLimits(
    born_before_ns=START + MARGIN,
    phantom_before_ns=START - MARGIN,
    orphan_before_ns=START - HORIZON,
)


def results_of(path: str) -> list[dict[str, object]]:
    return [r for batch in iter_batches(path) for r in batch.to_pylist()]


def test_every_planted_difference_is_found_exactly(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = MemoryStore()
        # Catalog: 0..9 in hour 0 (file 1), then superseding and conflicting rows.
        first = await put_catalog(store, 0, 1, 1, [row(n) for n in range(10)])
        # Key 1: newest row (a later file) holds another ETag than the listing shows.
        # Key 2: cataloged in two hours. Key 3: two hashes in one hour.
        # Key 4: an old row with another ETag, superseded by the newest (listed) one.
        later = await put_catalog(
            store,
            0,
            1,
            2,
            [row(1, etag='"other"'), row(3, frame=sha(103)), row(4, etag='W/"e4"')],
        )
        second_hour = await put_catalog(store, 1, 1, 3, [row(2, hour=1)])
        # Key 20: cataloged, never listed, old: a phantom candidate. Key 21: never
        # listed but its hour is not over before the limit: not one.
        phantom_rows = [
            row(20),
            IndexRow("accepted", mkey(21), sha(21), START - MARGIN // 2, etag='"e21"'),
        ]
        phantoms = await put_catalog(store, 0, 2, 1, phantom_rows[:1])
        late = await put_catalog(store, 9, 2, 2, phantom_rows[1:])
        # Key 5: cataloged without an ETag (takes the listed one): no read.
        no_etag = await put_catalog(store, 0, 2, 3, [replace(row(5), etag=None)])
        # Key 6: a file holding it twice, with two hashes (the later row is the newest).
        twice = await put_catalog(store, 0, 2, 4, [row(6), row(6, frame=sha(106))])
        copies, unreadable = await fetch_catalog(
            store,
            [first, later, second_hour, phantoms, late, no_etag, twice],
            str(tmp_path / "cat"),
        )
        assert unreadable == []
        listed = [(mkey(n), f'"e{n}"', T0) for n in range(10)]
        listed[5] = (mkey(5), '"anything"', T0)
        listed += [
            (mkey(30), '"e30"', T0),  # not cataloged: missing
            (mkey(31), '"e31"', START + 2 * MARGIN),  # young: the steady pass's
            ("accepted/v1/stray.txt", '"x"', T0),  # junk
        ]
        q = qkey(40, sha(41))
        listing = {
            "accepted": [write_part(tmp_path / "a.parquet", listed)],
            "quarantine": [write_part(tmp_path / "q.parquet", [(q, '"q"', T0)])],
            "raw-blobs": [
                write_part(
                    tmp_path / "b.parquet",
                    [blob_entry(sha(n)) for n in range(0, 10) if n != 7]  # 7: missing blob
                    + [blob_entry(sha(103)), blob_entry(sha(20)), blob_entry(sha(106))]
                    + [blob_entry(sha(500)), blob_entry(sha(501), START)]  # old / young orphan
                    + [("raw-blobs/v1/sha256/zz/junk", None, T0)],
                )
            ],
        }
        with AuditJoins(listing, copies, str(tmp_path / "spill"), memory_limit_mb=64) as joins:
            result = joins.run(LIMITS)
            records = results_of(result.records)
            by_key = {r["key"]: r for r in records}
            assert len(by_key) == len(records)  # one a key
            assert {k: r["reason"] for k, r in by_key.items()} == {
                mkey(1): "etag",
                mkey(2): "conflict",
                mkey(3): "conflict",
                mkey(6): "conflict",
                mkey(20): "phantom",
                mkey(30): "missing",
                "accepted/v1/stray.txt": "junk",
                q: "missing",
            }
            assert by_key[mkey(1)]["etag"] == "other"  # normalized
            assert by_key[mkey(2)]["time_unix_ns"] == T0 + HOUR_NS + 2  # the newest row's
            assert by_key[mkey(3)]["frame_sha256"] == sha(103)
            assert by_key[mkey(6)]["frame_sha256"] == sha(106)
            assert by_key[q]["kind"] == "quarantine"
            blobs = {r["frame_sha256"]: r for r in results_of(result.blobs)}
            orphans = sorted(s for s, r in blobs.items() if r["reason"] == "orphan")
            missing = sorted(s for s, r in blobs.items() if r["reason"] == "missing")
            # sha(3) is still referenced by key 3's older row: not an orphan.
            assert orphans == [sha(500)]
            assert missing == sorted([sha(7), sha(21)])
            referencing = {r["raw_key"]: r["record_key"] for r in results_of(result.referencing)}
            assert referencing == {
                keys.raw_blob_key(sha(7)): mkey(7),
                keys.raw_blob_key(sha(21)): mkey(21),
            }
            assert result.listed_old == {"accepted": 12, "quarantine": 1, "raw-blobs": 15}
            assert result.listed_young == {"accepted": 1, "quarantine": 0, "raw-blobs": 0}
            assert result.blobs_listed == 14
            assert joins.references(keys.raw_blob_key(sha(103)))
            assert not joins.references(keys.raw_blob_key(sha(500)))

    asyncio.run(scenario())


def test_the_blob_join_carries_fixed_size_columns_and_fetches_the_hashes_back(
    tmp_path: Path,
) -> None:
    """The stages with a row per listed blob or per referenced hash hold no string (a
    join that carried every listed blob's hash ran out of 512 MB at 50M manifests,
    `bench.join`); the hashes of the orphans come back from the listing (a key that
    only looks like the blob's is not one), those of missing blobs from the catalog."""

    async def scenario() -> None:
        store = MemoryStore()
        name = await put_catalog(store, 0, 1, 1, [row(1), row(2)])
        copies, _ = await fetch_catalog(store, [name], str(tmp_path / "c"))
        look_alike = "raw-blobs/v1/sha256/00/00/" + sha(501) + ".lmbatch"
        listing = {
            "raw-blobs": [
                write_part(
                    tmp_path / "b.parquet",
                    [
                        blob_entry(sha(1)),
                        blob_entry(sha(500)),
                        blob_entry(sha(501), T0 + 7),
                        (look_alike, '"b"', T0),  # not a blob key: skipped
                        blob_entry(sha(502), START),  # young: not an orphan yet
                    ],
                )
            ]
        }
        with AuditJoins(listing, copies, str(tmp_path / "spill"), memory_limit_mb=64) as joins:
            result = joins.run(LIMITS)
            blobs = {
                r["frame_sha256"]: (r["reason"], r["size"], r["last_modified_ns"])
                for r in results_of(result.blobs)
            }
            assert blobs == {
                sha(500): ("orphan", 100, T0),
                sha(501): ("orphan", 100, T0 + 7 - 7 % 1000),  # listed in microseconds
                sha(2): ("missing", None, None),
            }
            assert result.blobs_listed == 4
            con = joins._con  # the stages as `run_blobs` builds them, for their columns
            stages = (
                ("referenced", audit_sql.REFERENCED),
                ("listed_blobs", audit_sql.LISTED_BLOBS),
                ("blob_results", audit_sql.bind(audit_sql.BLOB_JOIN, orphan_before_ns=START)),
            )
            for table, query in stages:
                con.execute(f"CREATE TABLE {table} AS {query}")
                types = {c: t for c, t, *_ in con.execute(f"DESCRIBE {table}").fetchall()}
                strings = [c for c, t in types.items() if t == "VARCHAR"]
                # blob_results' reason is a constant of a few bytes, set after the join.
                assert strings == ([] if table != "blob_results" else ["reason"]), types

    asyncio.run(scenario())


def test_retired_rows_keep_no_blob_alive_and_are_never_missing(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = MemoryStore()
        retired_hour = await put_catalog(store, 0, 1, 1, [row(1), row(2)])
        live = await put_catalog(store, 1, 1, 2, [row(3, hour=1), row(4, hour=1)])
        quarantine = IndexRow(
            "quarantine",
            qkey(2, sha(99)),
            sha(99),
            T0 + 5,
            accepted_frame_sha256=sha(2),
            etag='"q"',
        )
        q_file = await put_catalog(store, 0, 1, 3, [quarantine])
        copies, _ = await fetch_catalog(store, [retired_hour, live, q_file], str(tmp_path / "c"))
        listing = {
            "raw-blobs": [
                # 1 is listed (an orphan now), 2 was deleted by raw retention (not
                # missing: a quarantine row references it too, but a retired row does),
                # 4 is missing.
                write_part(tmp_path / "b.parquet", [blob_entry(sha(n)) for n in (1, 3, 99)])
            ]
        }
        with AuditJoins(listing, copies, str(tmp_path / "spill"), memory_limit_mb=64) as joins:
            assert joins.accepted_batches([T0, T0 + HOUR_NS]) == {T0: 2, T0 + HOUR_NS: 2}
            joins.set_retired(frozenset({T0}))
            result = joins.run(LIMITS)
            blobs = {r["frame_sha256"]: r for r in results_of(result.blobs)}
            assert {s: (r["reason"], r["raw_retention"]) for s, r in blobs.items()} == {
                sha(1): ("orphan", True),
                sha(4): ("missing", False),
            }
            joins.set_retired(frozenset())  # the hour does not hold: its rows count
            result = joins.run(LIMITS)
            blobs = {r["frame_sha256"]: r["reason"] for r in results_of(result.blobs)}
            assert blobs == {sha(2): "missing", sha(4): "missing"}

    asyncio.run(scenario())


def test_a_pinned_file_that_is_gone_is_an_error_and_junk_files_are_reported(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        store = MemoryStore()
        good = await put_catalog(store, 0, 1, 1, [row(1)])
        bad = keys.index_catalog_key(keys.UtcHour.from_unix_ns(T0), 1, 2)
        await store.put(bad, b"not parquet")
        copies, unreadable = await fetch_catalog(store, [bad, good], str(tmp_path / "c"))
        assert [c.name for c in copies] == [good]
        assert [name for name, _why in unreadable] == [bad]
        gone = keys.index_catalog_key(keys.UtcHour.from_unix_ns(T0), 1, 3)
        with pytest.raises(PinnedFileMissing):
            await fetch_catalog(store, [good, gone], str(tmp_path / "d"))

    asyncio.run(scenario())


def test_no_inputs_give_empty_results(tmp_path: Path) -> None:
    with AuditJoins({}, [], str(tmp_path), memory_limit_mb=64) as joins:
        result = joins.run(LIMITS)
        assert results_of(result.records) == [] and results_of(result.blobs) == []
        assert result.blobs_listed == 0


def test_a_retired_hour_lets_go_of_its_blobs_only_while_it_holds(tmp_path: Path) -> None:
    """`settle_retired`: an hour whose catalog agrees with the ledger retires its accepted
    rows' blobs (orphans flagged raw_retention); one that does not keeps them, with a
    raw-retention-mismatch problem, resolved once it holds."""

    async def scenario() -> None:
        store = MemoryStore()
        clock = ManualClock(START)
        ctx = await context(store, clock)
        problems = ProblemBook(ctx)
        await problems.load()
        hour0 = await put_catalog(store, 0, 1, 1, [row(1), row(2)])
        hour1 = await put_catalog(store, 1, 1, 2, [row(3, hour=1)])
        copies, _ = await fetch_catalog(store, [hour0, hour1], str(tmp_path / "c"))
        listing = {
            "raw-blobs": [write_part(tmp_path / "b.parquet", [blob_entry(sha(n)) for n in (1, 3)])]
        }
        subject = keys.index_catalog_hour_prefix(keys.UtcHour.from_unix_ns(T0))
        with AuditJoins(listing, copies, str(tmp_path / "spill"), memory_limit_mb=64) as joins:
            hour = keys.UtcHour.from_unix_ns(T0)
            wrong = Retired(T0 + HOUR_NS, {hour.iso: LedgerHour(3, 30, "0" * 64)})
            assert await settle_retired(joins, copies, [], wrong, problems) == 0
            blobs = {r["frame_sha256"]: r["reason"] for r in results_of(joins.run(LIMITS).blobs)}
            assert blobs == {sha(2): "missing"}
            assert [s async for s in problems.subjects("raw-retention-mismatch")] == [subject]
            right = Retired(T0 + HOUR_NS, {hour.iso: LedgerHour(2, 20, "0" * 64)})
            assert await settle_retired(joins, copies, [], right, problems) == 2
            result = joins.run(LIMITS)
            blobs = {
                r["frame_sha256"]: (r["reason"], r["raw_retention"])
                for r in results_of(result.blobs)
            }
            assert blobs == {sha(1): ("orphan", True)}
            assert [s async for s in problems.subjects("raw-retention-mismatch")] == []
            # A moved-aside file of the hour: it does not hold.
            assert await settle_retired(joins, copies, [hour0], right, problems) == 0

    asyncio.run(scenario())
