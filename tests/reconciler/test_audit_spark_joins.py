"""The audit's joins on Spark (`reconciler.audit.engines.spark_joins`, issue 23 item 3): from the
same listing parts and pinned catalog files, the same result files as the local engine
(`reconciler.audit.engines.duckdb_joins.AuditJoins`), row for row; a pinned file that is gone is an
error. A local Spark session (local[2]) over a filesystem store in tmp_path."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq
import pytest

from index.rows import IndexRow
from protocol import keys
from reconciler.audit.engines.duckdb_joins import AuditJoins, PinnedFileMissing, fetch_catalog
from reconciler.audit.engines.spark_joins import SparkAuditJoins
from reconciler.audit.engines.spark_results import (
    BAD_RANGES_SCHEMA,
    BLOBS_SCHEMA,
    BUNDLES_SCHEMA,
    RECORDS_SCHEMA,
    REFERENCING_SCHEMA,
)
from reconciler.audit.engines.spark_run import size_shuffle
from rollup.table.storage import StoreAccess
from store.fs import FileSystemStore
from tests.reconciler.test_audit_joins import (
    HOUR_NS,
    LIMITS,
    MARGIN,
    START,
    T0,
    blob_entry,
    mkey,
    put_catalog,
    qkey,
    row,
    sha,
    write_part,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


BUNDLE = keys.raw_bundle_key(sha(901))
MISSING = keys.raw_bundle_key(sha(903))
BUNDLE_SIZE = 300
"""Listed bundles' size: ranges of 100 bytes end at most at 244 (an index entry of 44
bytes and the footer's 12 after the data part)."""


def bundled(n: int, offset: int, bundle: str = BUNDLE) -> IndexRow:
    """An accepted row naming 100 bytes of ``bundle`` at ``offset``."""
    return replace(row(n), raw_blob_key=bundle, raw_offset=offset, raw_length=100)


async def planted(store: FileSystemStore, tmp: Path) -> tuple[dict[str, list[str]], list[str]]:
    """Listing parts (store keys, per kind) and catalog files with every kind of difference
    (as test_audit_joins plants them), plus a quarantine row's reference and a junk file."""
    names = [
        await put_catalog(store, 0, 1, 1, [row(n) for n in range(10)]),  # type: ignore[arg-type]
        await put_catalog(
            store,  # type: ignore[arg-type]
            0,
            1,
            2,
            [row(1, etag='"other"'), row(3, frame=sha(103)), row(4, etag='W/"e4"')],
        ),
        await put_catalog(store, 1, 1, 3, [row(2, hour=1)]),  # type: ignore[arg-type]
        await put_catalog(store, 0, 2, 1, [row(20)]),  # type: ignore[arg-type]
        await put_catalog(
            store,  # type: ignore[arg-type]
            9,
            2,
            2,
            [IndexRow("accepted", mkey(21), sha(21), START - MARGIN // 2, etag='"e21"')],
        ),
        await put_catalog(store, 0, 2, 3, [replace(row(5), etag=None)]),  # type: ignore[arg-type]
        await put_catalog(store, 0, 2, 4, [row(6), row(6, frame=sha(106))]),  # type: ignore[arg-type]
        await put_catalog(
            store,  # type: ignore[arg-type]
            0,
            2,
            5,
            [
                IndexRow(
                    "quarantine",
                    qkey(2, sha(99)),
                    sha(99),
                    T0 + 5,
                    accepted_frame_sha256=sha(8),
                    etag='"q"',
                ),
                # Its accepted frame is in a bundle (row 50's): the copy never made is
                # missing unless that row is retired (PROTOCOL §3.10, §4.1).
                IndexRow(
                    "quarantine",
                    qkey(50, sha(98)),
                    sha(98),
                    T0 + 6,
                    accepted_frame_sha256=sha(50),
                    etag='"q"',
                ),
            ],
        ),
    ]
    junk = keys.index_catalog_key(keys.UtcHour.from_unix_ns(T0), 3, 1)
    await store.put(junk, b"not parquet")
    names.append(junk)
    listed = [(mkey(n), f'"e{n}"', T0) for n in range(10)]
    listed[5] = (mkey(5), '"anything"', T0)
    listed += [
        (mkey(30), '"e30"', T0),
        (mkey(31), '"e31"', START + 2 * MARGIN),
        ("accepted/v1/stray.txt", '"x"', T0),
        (
            "accepted/v1/agent=a1/boot=" + "0" * 32 + "/" + "1" * 20 + "-" + "2" * 20 + "Xjson",
            '"y"',
            T0,
        ),
    ]
    blobs = [blob_entry(sha(n)) for n in range(10) if n not in (7, 8)]
    blobs += [blob_entry(sha(103)), blob_entry(sha(20)), blob_entry(sha(106))]
    blobs += [blob_entry(sha(500)), blob_entry(sha(501), START), blob_entry(sha(99))]
    blobs += [blob_entry(sha(98))]
    blobs += [("raw-blobs/v1/sha256/zz/junk", None, T0)]
    # Bundles (PROTOCOL §3.10): one two rows name (one range past its end: bad-range),
    # one nobody names (an orphan), one a row names that is not listed (missing).
    bundles = [(BUNDLE, '"n"', T0), (keys.raw_bundle_key(sha(902)), '"n"', T0)]
    bundles += [("raw-bundles/v1/sha256/zz/junk", None, T0)]
    names.insert(  # before the junk file, which stays last
        -1,
        await put_catalog(
            store,  # type: ignore[arg-type]
            0,
            2,
            6,
            [bundled(50, 0), bundled(51, 100), bundled(52, 150), bundled(53, 0, MISSING)],
        ),
    )
    listed += [(mkey(n), f'"e{n}"', T0) for n in (50, 51, 52, 53)]
    parts = {
        "accepted": [listed[:7], listed[7:]],
        "quarantine": [
            [(qkey(40, sha(41)), '"q"', T0), (qkey(2, sha(99)), '"q"', T0)],
            [(qkey(50, sha(98)), '"q"', T0)],
        ],
        "raw-blobs": [blobs],
        "raw-bundles": [bundles],
    }
    listing: dict[str, list[str]] = {}
    for kind, entries in parts.items():
        for i, part in enumerate(entries):
            size = BUNDLE_SIZE if kind == "raw-bundles" else 100
            path = write_part(tmp / f"{kind}-{i}.parquet", part, size=size)
            key = f"reconciler/v1/audits/x/listing/{kind}/{i:05d}-000000-n{len(part)}.parquet"
            await store.put(key, await asyncio.to_thread(Path(path).read_bytes))
            listing.setdefault(kind, []).append(key)
    return listing, names


def rows_of(path: str) -> list[dict[str, Any]]:
    return pq.read_table(path).to_pylist()


def test_spark_writes_the_local_engines_results_row_for_row(
    spark: SparkSession, tmp_path: Path
) -> None:
    store = FileSystemStore(tmp_path / "store")
    listing, names = asyncio.run(planted(store, tmp_path))
    copies, unreadable = asyncio.run(fetch_catalog(store, names, str(tmp_path / "copies")))
    local_paths = {k: [str(tmp_path / "store" / key) for key in v] for k, v in listing.items()}
    access = StoreAccess(store.url)
    assert size_shuffle(spark, rows=100) == 2  # as the run does: a few keys, local[2]
    with (
        AuditJoins(local_paths, copies, str(tmp_path / "duck"), memory_limit_mb=64) as duck,  # type: ignore[arg-type]
        SparkAuditJoins(
            spark,
            access,
            listing,  # type: ignore[arg-type]
            names,
            results_prefix="reconciler/v1/audits/x/spark-results/",
            out_dir=str(tmp_path / "spark"),
        ) as sparked,
    ):
        assert [n for n, _w in sparked.unreadable] == [n for n, _w in unreadable] == names[-1:]
        assert [c.name for c in sparked.readable] == [c.name for c in copies]
        hours = [T0, T0 + HOUR_NS]
        assert sparked.accepted_batches(hours) == duck.accepted_batches(hours)
        for retired in (frozenset(), frozenset({T0})):
            duck.set_retired(retired)
            sparked.set_retired(retired)
            want, got = duck.run(LIMITS), sparked.run(LIMITS)
            want_records = sorted(rows_of(want.records), key=lambda r: r["key"])
            assert rows_of(got.records) == want_records
            assert {r["reason"] for r in want_records} == {
                "etag",
                "conflict",
                "phantom",
                "missing",
                "junk",
            }
            blob_key = lambda r: r["raw_key"]  # noqa: E731
            want_blobs = sorted(rows_of(want.blobs), key=blob_key)
            assert rows_of(got.blobs) == want_blobs and want_blobs
            bundles = {keys.raw_bundle_key(sha(902))} | ({MISSING} if not retired else set())
            assert {r["raw_key"] for r in want_blobs} >= bundles  # a retired row's: not missing
            copy = keys.raw_blob_key(sha(50))  # its bundle's row retired: not missing
            assert (copy in {r["raw_key"] for r in want_blobs}) == (not retired)
            want_refs = sorted(rows_of(want.referencing), key=blob_key)
            assert rows_of(got.referencing) == want_refs and want_refs
            want_bad = rows_of(want.bad_ranges)
            assert rows_of(got.bad_ranges) == want_bad
            assert [(r["record_key"], r["raw_offset"]) for r in want_bad] == [(mkey(52), 150)]
            want_bundles = sorted(rows_of(want.bundles), key=blob_key)
            assert rows_of(got.bundles) == want_bundles
            # Three ranges of 100 (a bad one too) in 300 listed bytes; one nobody names.
            assert {r["raw_key"]: r["dead_bytes"] for r in want_bundles} == {
                BUNDLE: 0,
                keys.raw_bundle_key(sha(902)): BUNDLE_SIZE,
            }
            for path, schema in (
                (want.records, RECORDS_SCHEMA),
                (want.blobs, BLOBS_SCHEMA),
                (want.referencing, REFERENCING_SCHEMA),
                (want.bad_ranges, BAD_RANGES_SCHEMA),
                (want.bundles, BUNDLES_SCHEMA),
            ):
                assert pq.read_schema(path).remove_metadata() == schema
            assert pq.read_schema(got.records).remove_metadata() == RECORDS_SCHEMA
            assert (got.listed_old, got.listed_young) == (want.listed_old, want.listed_young)
            assert (got.blobs_listed, got.reasons) == (want.blobs_listed, want.reasons)
            for raw_key in [keys.raw_blob_key(sha(n)) for n in (103, 500, 8, 1)] + [BUNDLE]:
                assert sparked.references(raw_key) == duck.references(raw_key)


def test_a_pinned_file_that_is_gone_stops_the_spark_joins(
    spark: SparkSession, tmp_path: Path
) -> None:
    store = FileSystemStore(tmp_path / "store")
    listing, names = asyncio.run(planted(store, tmp_path))
    gone = keys.index_catalog_key(keys.UtcHour.from_unix_ns(T0), 1, 9)
    with pytest.raises(PinnedFileMissing, match="is gone"):
        SparkAuditJoins(
            spark,
            StoreAccess(store.url),
            listing,  # type: ignore[arg-type]
            [*names, gone],
            results_prefix="r/",
            out_dir=str(tmp_path / "spark"),
        )
