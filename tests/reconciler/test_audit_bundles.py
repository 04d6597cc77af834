"""The full audit over a store of frame blobs and bundles (PROTOCOL §3.9, §3.10): it lists
``raw-bundles/v1/`` too, joins records to raw objects by key, records ``bad-range`` for a
range past its bundle's listed size, counts each bundle's dead bytes from the listing (no
GET), and a bundle a catalog row names is no orphan. The DuckDB engine on a memory store
(the Spark engine's equality: tests/reconciler/test_audit_spark_joins.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from index.catalog_rank import RANK_COLUMNS
from index.rows import RANGE_COLUMNS, IndexRow, table_of
from protocol import keys
from protocol.bundle import encode_bundle
from protocol.clock import ManualClock
from protocol.records import AcceptedManifest
from reconciler.audit.engines.duckdb_joins import AuditJoins, fetch_catalog
from reconciler.audit.run import run_full_audit
from reconciler.problems import count_problems
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    T0_NS,
    Batch,
    catalog_rows,
    context,
    make_batch,
    make_settings,
    with_retry_horizon,
    write_batches,
)
from tests.reconciler.test_audit_joins import (
    HOUR_NS,
    LIMITS,
    T0,
    blob_entry,
    mkey,
    put_catalog,
    qkey,
    results_of,
    row,
    sha,
    write_part,
)

S = keys.NS_PER_S
HOUR_S = 3600


async def write_bundle(
    store: MemoryStore, batches: list[Batch], *, named: int, offset_shift: int = 0
) -> tuple[str, int, list[AcceptedManifest]]:
    """``batches``' frames as one bundle, and the manifests of the first ``named`` of them
    (the rest are dead bytes: duplicates, say), with ``offset_shift`` added to their
    offsets. Returns the bundle's key, size and the manifests written."""
    bundle = encode_bundle([b.frame for b in batches])
    await store.put(bundle.key, bundle.data, if_none_match=True)
    manifests = []
    for batch, entry in zip(batches[:named], bundle.entries, strict=False):
        manifest = AcceptedManifest.of_frame(
            batch.frame,
            accepted_at_unix_ns=batch.manifest.accepted_at_unix_ns,
            collector_id="collector-test",
            bundle=(bundle.key, entry.offset + offset_shift),
        )
        await store.put(manifest.manifest_key, manifest.to_json(), if_none_match=True)
        manifests.append(manifest)
    return bundle.key, len(bundle.data), manifests


async def test_frame_blobs_and_bundles_audit_clean_with_dead_bytes_and_orphans(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    blobs = await write_batches(memory_store, agents=2, per_agent=2)
    live = [make_batch(7, seq, T0_NS + (10 + seq) * S) for seq in range(3)]
    live_key, live_size, manifests = await write_bundle(memory_store, live, named=2)
    orphan = [make_batch(8, seq, T0_NS + (20 + seq) * S) for seq in range(2)]
    orphan_key, orphan_size, _ = await write_bundle(memory_store, orphan, named=0)
    clock.advance(2 * HOUR_S)
    ctx = await context(memory_store, clock, settings=with_retry_horizon(make_settings(), HOUR_S))

    record = await run_full_audit(ctx)

    assert record.status == "completed"
    assert await count_problems(memory_store) == {}  # no missing-blob, no bad-range
    rows = await catalog_rows(memory_store)
    assert set(rows) == {b.key for b in blobs} | {m.manifest_key for m in manifests}
    for manifest in manifests:  # the rows carry the manifests' ranges
        found = rows[manifest.manifest_key]
        assert (found.raw_blob_key, found.raw_offset, found.raw_length) == (
            live_key,
            manifest.raw_offset,
            manifest.raw_length,
        )
    assert rows[blobs[0].key].raw_offset is None
    body, _ = await memory_store.get(
        keys.audit_orphans_key(record.started_at_unix_ns, record.audit_id)
    )
    orphans = pq.read_table(io.BytesIO(body)).to_pylist()
    # The bundle two manifests name is no orphan; the one nobody names is, by its key.
    assert [(o["raw_blob_key"], o["frame_sha256"]) for o in orphans] == [
        (orphan_key, keys.parse_raw_bundle_key(orphan_key))
    ]
    assert (record.blobs_listed, record.orphans) == (len(blobs) + 2, 1)
    named_bytes = sum(len(b.frame) for b in live[:2])
    assert (record.bundles_listed, record.bundle_bytes) == (2, live_size + orphan_size)
    assert record.bundle_dead_bytes == (live_size - named_bytes) + orphan_size
    assert record.keys_listed["raw-bundles"] == 2 and record.bundle_pinned_bytes == 0


async def test_a_range_past_the_listed_size_is_bad_range_and_a_missing_bundle_is_missing(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = [make_batch(3, seq, T0_NS + seq * S) for seq in range(2)]
    bundle_key, size, manifests = await write_bundle(memory_store, batches, named=2, offset_shift=0)
    # A third frame's manifest names the same bundle past its end (well-formed: the
    # index-entry check needs the bundle, the audit checks the listed size).
    late = make_batch(3, 5, T0_NS + 5 * S)
    past = AcceptedManifest.of_frame(
        late.frame,
        accepted_at_unix_ns=late.manifest.accepted_at_unix_ns,
        collector_id="collector-test",
        bundle=(bundle_key, size),
    )
    await memory_store.put(past.manifest_key, past.to_json(), if_none_match=True)
    gone = make_batch(4, 0, T0_NS + 9 * S)
    gone_bundle = encode_bundle([gone.frame])
    nowhere = AcceptedManifest.of_frame(
        gone.frame,
        accepted_at_unix_ns=gone.manifest.accepted_at_unix_ns,
        collector_id="collector-test",
        bundle=(gone_bundle.key, 0),
    )
    await memory_store.put(nowhere.manifest_key, nowhere.to_json(), if_none_match=True)
    clock.advance(2 * HOUR_S)
    ctx = await context(memory_store, clock, settings=with_retry_horizon(make_settings(), HOUR_S))

    record = await run_full_audit(ctx)

    assert record.status == "completed"
    assert await count_problems(memory_store) == {"bad-range": 1, "missing-blob": 1}
    assert await memory_store.get(keys.problem_key("bad-range", bundle_key))
    assert await memory_store.get(keys.problem_key("missing-blob", gone_bundle.key))
    assert len(manifests) == 2 and record.orphans == 0


def test_rows_of_one_key_that_differ_in_raw_key_or_range_disagree(tmp_path: Path) -> None:
    """PROTOCOL §3.7: like two hashes, two ranges or two raw keys of one key are read back
    (``conflict``); rows that agree are not."""
    bundle = keys.raw_bundle_key(sha(900))

    def bundled(n: int, offset: int) -> IndexRow:
        return dataclasses.replace(row(n), raw_blob_key=bundle, raw_offset=offset, raw_length=100)

    async def scenario() -> None:
        store = MemoryStore()
        names = [
            await put_catalog(store, 0, 1, 1, [bundled(1, 0), bundled(2, 0), bundled(3, 0)]),
            await put_catalog(store, 0, 1, 2, [bundled(1, 0), bundled(2, 200), row(3)]),
        ]
        copies, _ = await fetch_catalog(store, names, str(tmp_path / "c"))
        listed = [(mkey(n), f'"e{n}"', T0) for n in (1, 2, 3)]
        listing = {"accepted": [write_part(tmp_path / "a.parquet", listed)]}
        with AuditJoins(listing, copies, str(tmp_path / "spill"), memory_limit_mb=64) as joins:  # type: ignore[arg-type]
            found = results_of(joins.run_records(LIMITS).records)
        assert {r["key"]: r["reason"] for r in found} == {mkey(2): "conflict", mkey(3): "conflict"}
        newest = {r["key"]: (r["raw_blob_key"], r["raw_offset"]) for r in found}
        assert newest == {mkey(2): (bundle, 200), mkey(3): (keys.raw_blob_key(sha(3)), None)}

    asyncio.run(scenario())


def test_a_bundle_some_of_whose_rows_are_retired_is_pinned_and_kept(tmp_path: Path) -> None:
    """Raw retention retires hours, a bundle goes whole (PROTOCOL §3.10): a bundle named
    by a retired row and a live one is pinned (no orphan); one named by retired rows only
    is a raw-retention orphan, by its key."""
    pinned, retired_only = keys.raw_bundle_key(sha(910)), keys.raw_bundle_key(sha(911))

    def bundled(n: int, bundle: str, offset: int, hour: int) -> IndexRow:
        base = row(n, hour=hour)
        return dataclasses.replace(base, raw_blob_key=bundle, raw_offset=offset, raw_length=100)

    async def scenario() -> None:
        store = MemoryStore()
        names = [
            await put_catalog(
                store, 0, 1, 1, [bundled(1, pinned, 0, 0), bundled(2, retired_only, 0, 0)]
            ),
            await put_catalog(store, 0, 1, 2, [bundled(3, retired_only, 100, 0)]),
            await put_catalog(store, 1, 1, 3, [bundled(4, pinned, 100, 1)]),
        ]
        copies, _ = await fetch_catalog(store, names, str(tmp_path / "c"))
        listed = [(pinned, '"b"', T0), (retired_only, '"b"', T0)]
        listing = {"raw-bundles": [write_part(tmp_path / "n.parquet", listed, size=1000)]}
        with AuditJoins(listing, copies, str(tmp_path / "spill"), memory_limit_mb=64) as joins:  # type: ignore[arg-type]
            joins.set_retired(frozenset({T0}))
            result = joins.run(LIMITS)
            bundles = {r["raw_key"]: r for r in results_of(result.bundles)}
            orphans = {r["raw_key"]: r["raw_retention"] for r in results_of(result.blobs)}
            totals = joins.bundle_totals(result)
        assert {k: (r["pinned"], r["dead_bytes"]) for k, r in bundles.items()} == {
            pinned: (True, 800),
            retired_only: (False, 800),
        }
        assert orphans == {retired_only: True}
        assert totals == {
            "bundles_listed": 2,
            "bundle_bytes": 2000,
            "bundle_dead_bytes": 1600,
            "bundle_pinned_bytes": 1000,
        }

    asyncio.run(scenario())


def test_a_conflict_s_accepted_copy_of_a_retired_bundled_frame_is_never_missing(
    tmp_path: Path,
) -> None:
    """A twin after raw retention deleted the accepted frame's bundle: its quarantine row
    names the frame blob copy never made (PROTOCOL §3.10: a 404 on the bundle). Its bytes
    were retired, not lost (§4.1): not missing, as for a retired frame blob; a copy that
    exists stays alive (the quarantine row is live); a frame never retired stays missing."""
    gone, live = keys.raw_bundle_key(sha(920)), keys.raw_bundle_key(sha(921))

    def bundled(n: int, bundle: str, hour: int) -> IndexRow:
        return dataclasses.replace(
            row(n, hour=hour), raw_blob_key=bundle, raw_offset=100 * n, raw_length=100
        )

    def twin(n: int) -> IndexRow:
        return IndexRow(
            "quarantine", qkey(n, sha(900 + n)), sha(900 + n), T0 + HOUR_NS + n,
            accepted_frame_sha256=sha(n), etag='"q"',
        )  # fmt: skip

    async def scenario() -> None:
        store = MemoryStore()
        # Hour 0 (retired): 1 and 4 in the deleted bundle (4's copy was made before), 2 a
        # deleted frame blob. Hour 1 (live): 3 in a listed bundle, its copy never made.
        names = [
            await put_catalog(store, 0, 1, 1, [bundled(1, gone, 0), row(2), bundled(4, gone, 0)]),
            await put_catalog(store, 1, 1, 2, [bundled(3, live, 1), *map(twin, (1, 2, 3, 4))]),
        ]
        copies, _ = await fetch_catalog(store, names, str(tmp_path / "c"))
        blobs = [blob_entry(sha(n)) for n in (4, 901, 902, 903, 904)]
        listing = {
            "raw-blobs": [write_part(tmp_path / "b.parquet", blobs)],
            "raw-bundles": [write_part(tmp_path / "n.parquet", [(live, '"n"', T0)], size=1000)],
        }
        with AuditJoins(listing, copies, str(tmp_path / "spill"), memory_limit_mb=64) as joins:  # type: ignore[arg-type]
            joins.set_retired(frozenset({T0}))
            retired = {r["raw_key"]: r["reason"] for r in results_of(joins.run(LIMITS).blobs)}
            joins.set_retired(frozenset())  # the hour does not hold: its rows are live
            held = {r["raw_key"]: r["reason"] for r in results_of(joins.run(LIMITS).blobs)}
        assert retired == {keys.raw_blob_key(sha(3)): "missing"}
        assert held == {
            gone: "missing",
            **{keys.raw_blob_key(sha(n)): "missing" for n in (1, 2, 3)},
        }

    asyncio.run(scenario())


def test_catalog_files_of_before_the_range_columns_are_copied_as_they_are(
    tmp_path: Path,
) -> None:
    """A merged (ranked) file written before raw_offset/raw_length is not rewritten by the
    audit's copy (a rewrite of the whole history costs 2.5-4 s a million rows an audit):
    the joins read the columns as null, also when no file has them."""

    def old_file(rows: list[IndexRow]) -> bytes:
        table = table_of(rows)
        for name in RANK_COLUMNS:
            table = table.set_column(
                table.schema.get_field_index(name), name, pa.array([1] * len(rows), pa.int64())
            )
        sink = io.BytesIO()
        pq.write_table(table.drop_columns(sorted(RANGE_COLUMNS)), sink, compression="zstd")
        return sink.getvalue()

    async def scenario() -> None:
        store = MemoryStore()
        name = keys.index_catalog_key(keys.UtcHour.from_unix_ns(T0), 1, 1)
        body = old_file([row(1), row(2)])
        await store.put(name, body)
        copies, _ = await fetch_catalog(store, [name], str(tmp_path / "c"))
        assert await asyncio.to_thread(Path(copies[0].path).read_bytes) == body  # no rewrite
        listed = [(mkey(n), f'"e{n}"', T0) for n in (1, 2)]
        listing = {
            "accepted": [write_part(tmp_path / "a.parquet", listed)],
            "raw-blobs": [
                write_part(
                    tmp_path / "b.parquet", [(keys.raw_blob_key(sha(n)), '"b"', T0) for n in (1, 3)]
                )
            ],
        }
        with AuditJoins(listing, copies, str(tmp_path / "spill"), memory_limit_mb=64) as joins:  # type: ignore[arg-type]
            result = joins.run(LIMITS)
            assert results_of(result.records) == []
            blobs = {r["raw_key"]: r["reason"] for r in results_of(result.blobs)}
        assert blobs == {keys.raw_blob_key(sha(2)): "missing", keys.raw_blob_key(sha(3)): "orphan"}

    asyncio.run(scenario())
