"""One busy catalog hour, compacted out of core: peak RSS and time (issue 22, PROTOCOL §3.9).

``python -m bench.catalog_hour [--rows 3600000] [--files 360]`` writes one hour of
``--rows`` catalog rows (1k batches/s for an hour) as ``--files`` level-0 files into a
fresh filesystem store, then, each in a child process of its own (so its peak RSS is its
own, read from ``/proc/<pid>/status`` VmHWM):

- **levels**: the compactor's path, `index.catalog_merge.merge_files` by levels of 8
  (level 0 -> 1 -> 2 ...) and the final merge of the settled hour, under
  ``--memory-limit-mb`` (DuckDB spills beyond it);
- **totals**: `index.catalog_tables.read_hour_totals` of the hour (all its files, out of
  core in DuckDB: what raw retention and the live query's seal check do); after
  **levels**, the merges' inputs are deleted (as after the readers' grace) and the
  settled hour is one merged file, read without the newest-per-key aggregate; the same
  read with the aggregate (the code before) is measured too;
- **baseline** (same run): the code this replaced, `chaos.catalog_rows.read_hour` (one Python
  row object per key) on ``--baseline-rows`` rows (default a tenth), whose RSS per row
  above the interpreter's own (measured after imports) is scaled to the whole hour;
- **spans**: `index.catalog_spans.read_hour_spans` of every batch of the hour (the live
  query's ``late_batches``, out of core), and **spans-baseline** (same run, the whole
  hour): the code it replaced, the hour's span columns read into memory
  (`index.catalog_tables.read_hour_table`) and grouped in Arrow. Both build the hour's
  ``manifest_id``\\s first (what the collector holds as the ledger's, 376 MB here), and
  their peak counts from there ("above the imports": above the imports and the ids);
- **aggregate** (before **levels**): the totals of the hour as the steady pass wrote it,
  every key through `index.catalog_local.NEWEST_PER_KEY` (fixed-size states), and the
  same with the aggregate of before (`STRUCT_NEWEST_PER_KEY`);
- **grace** (after **levels**, before the inputs' deletion): the hour's totals while the
  merges' inputs still wait out the readers' grace, fetching only the files whose rows
  count (`index.catalog_local.counted_copies`), and the same with every file fetched
  (the code before), each with its catalog GETs.

``--phases`` picks some of ``aggregate,levels,grace,totals,baseline,spans`` (default all).

Benchmarks are not tests: nothing asserts; the numbers go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench import child_process
from chaos.catalog_rows import read_hour
from index import catalog_local, catalog_tables
from index.catalog import CatalogWriter, delete_compacted_inputs, list_hour_files
from index.catalog_local import MergeLimits
from index.catalog_merge import merge_files
from index.catalog_spans import HIGHEST, LOWEST, read_hour_spans
from index.catalog_tables import manifest_ids, read_hour_table, read_hour_totals
from index.row_checks import raw_blob_keys
from index.rows import FILE_SCHEMA
from protocol import keys
from protocol.clock import ManualClock
from reconciler.steady_rows import with_key_digests
from store.base import ObjectInfo
from store.counting import CountingStore
from store.open import open_store

T0 = 1_760_000_400_000_000_000  # inside 2025-10-09T09
HOUR = keys.UtcHour.from_unix_ns(T0)
FANOUT = 8
STRUCT_NEWEST_PER_KEY = """
CREATE TEMP TABLE newest AS
SELECT key, max(struct_pack(
    rank := struct_pack(e := first_epoch, s := first_sequence, q := first_position),
    f := filename, r := file_row_number)) AS pick
FROM read_parquet({files}, filename = true, file_row_number = true)
GROUP BY key HAVING count(*) > 1
"""
"""The baseline: `index.catalog_local.NEWEST_PER_KEY` as it was before its states were
fixed-size (the aggregate state holds the file's name)."""
STRUCT_ONE_ROW_PER_KEY = """read_parquet({files}, filename = true, file_row_number = true) AS r
    LEFT JOIN newest AS n ON r.key = n.key
    WHERE (n.key IS NULL OR (r.filename = n.pick.f AND r.file_row_number = n.pick.r))"""
PHASES = ("aggregate", "levels", "grace", "totals", "baseline", "spans")


def synthetic_rows(start: int, count: int, rng: np.random.Generator) -> pa.Table:
    """``count`` well-formed accepted rows (agents of 1,000 batches each), column-wise."""
    seq = np.arange(start, start + count, dtype=np.uint64)
    agents = pc.binary_join_element_wise(
        "agent-", pc.cast(pa.array((seq // 1000).astype(np.int64)), pa.string()), ""
    )
    # hex of "agent-<n>": the ASCII bytes' hex, one Python step per distinct agent
    encoded = pc.dictionary_encode(agents)
    agent_hex = pa.array(
        [a.encode().hex() for a in encoded.dictionary.to_pylist()], pa.string()
    ).take(encoded.indices)
    boot = "5f0c7a3e-1d2b-4c3a-9e8f-0123456789ab"
    seq20 = pc.utf8_lpad(pc.cast(pa.array(seq), pa.string()), 20, "0")
    key = pc.binary_join_element_wise(
        "accepted/v1/agent=",
        agent_hex,
        "/boot=",
        boot.replace("-", ""),
        "/",
        seq20,
        "-",
        seq20,
        ".json",
        "",
    )
    hexed = np.frombuffer(rng.bytes(32 * count).hex().encode(), dtype="S64")
    sha = pa.array(hexed).cast(pa.string())
    times = pa.array(T0 + np.arange(count, dtype=np.int64) * 1000, pa.int64())
    columns = {
        "kind": pa.repeat(pa.scalar("accepted"), count),
        "key": key,
        "frame_sha256": sha,
        "accepted_frame_sha256": pa.nulls(count, pa.string()),
        "raw_blob_key": raw_blob_keys(sha),
        "agent_id": agents,
        "boot_id": pa.repeat(pa.scalar(boot), count),
        "seq_start": pa.array(seq),
        "seq_end": pa.array(seq),
        "record_count": pa.repeat(pa.scalar(100, pa.int64()), count),
        "frame_bytes": pa.repeat(pa.scalar(4096, pa.int64()), count),
        "time_unix_ns": times,
        "etag": pc.utf8_slice_codeunits(sha, 0, 32),
        "own_create": pa.repeat(pa.scalar(True), count),
        "min_ts_ns": times,
        "max_ts_ns": times,
        "source": pa.repeat(pa.scalar("index/v1/log/date=2025-10-09/hour=09/x.parquet"), count),
        "key_digest": pa.nulls(count, pa.binary(16)),
    }
    # Columns not given (the rows' rank, ranges: PROTOCOL §3.10) are null, as for rows
    # first written in the file.
    full = {f.name: columns.get(f.name, pa.nulls(count, f.type)) for f in FILE_SCHEMA}
    return with_key_digests(pa.table(full, schema=FILE_SCHEMA))


async def seed(url: str, rows: int, files: int) -> None:
    store = open_store(url)
    writer = CatalogWriter(store=store, clock=ManualClock(T0), rng=random.Random(1), epoch=1)
    rng = np.random.default_rng(7)
    per_file = rows // files
    for i in range(files):
        count = per_file if i < files - 1 else rows - per_file * (files - 1)
        await writer.write_table(HOUR, synthetic_rows(i * per_file, count, rng), writer="steady")


async def compact_by_levels(url: str, memory_limit_mb: int, spill: str) -> dict[str, object]:
    """As `reconciler.compaction.CatalogCompactor`: levels of FANOUT, then the final merge."""
    store = open_store(url)
    writer = CatalogWriter(store=store, clock=ManualClock(T0), rng=random.Random(2), epoch=2)
    limits = MergeLimits(memory_limit_mb=memory_limit_mb, spill_dir=spill)
    level_files = {0: sorted(info.key for info in await list_hour_files(store, HOUR))}
    merges, rewritten, level, last_rows = 0, 0, 0, 0
    while len(level_files.get(level, [])) >= FANOUT:
        names = level_files[level]
        nxt = []
        for i in range(0, len(names) - len(names) % FANOUT, FANOUT):
            group = [_named(n) for n in names[i : i + FANOUT]]
            merged = await merge_files(store, writer, HOUR, group, level=level + 1, limits=limits)
            nxt.append(merged.merged_key)
            merges, rewritten, last_rows = merges + 1, rewritten + merged.rows, merged.rows
        level_files[level + 1] = nxt + level_files.get(level + 1, [])
        level_files[level] = names[len(names) - len(names) % FANOUT :]
        level += 1
    final_inputs = [_named(n) for files in level_files.values() for n in files]
    if len(final_inputs) > 1:  # else the levels left one merged file (FANOUT^k files)
        final = await merge_files(store, writer, HOUR, final_inputs, level=level + 1, limits=limits)
        merges, rewritten, last_rows = merges + 1, rewritten + final.rows, final.rows
    return {
        "merges": merges,
        "rows_rewritten": rewritten,
        "rows": last_rows,
        "final_inputs": len(final_inputs),
    }


async def totals(
    url: str,
    memory_limit_mb: int,
    spill: str,
    *,
    aggregate: bool = False,
    fetch_all: bool = False,
    struct: bool = False,
) -> dict[str, object]:
    """What raw retention and the live query's seal check do: the hour's totals, out of
    core (`index.catalog_tables.read_hour_totals`). ``aggregate``: the baseline for an
    hour compacted into one merged file, read with the newest-per-key aggregate all the
    same (the code before `index.catalog_local.Copies.one_merged_file`). ``fetch_all``: the
    baseline for an hour whose merges' inputs await deletion, every file fetched (the
    code before `index.catalog_local.counted_copies` left out the ones a merge holds).
    ``struct``: the baseline for the newest-per-key aggregate, picking each key's row by
    a ``max`` over a struct of the rank and the file's name (the code before the
    fixed-size states of `index.catalog_local.NEWEST_PER_KEY`)."""
    if aggregate:
        setattr(catalog_tables, "NO_KEY_TWICE", catalog_local.NEWEST_PER_KEY)  # noqa: B010
    if fetch_all:
        every_file = functools.partial(catalog_local.counted_copies, fetch_all=True)
        setattr(catalog_tables, "counted_copies", every_file)  # noqa: B010
    if struct:
        setattr(catalog_tables, "NEWEST_PER_KEY", STRUCT_NEWEST_PER_KEY)  # noqa: B010
        setattr(catalog_tables, "ONE_ROW_PER_KEY", STRUCT_ONE_ROW_PER_KEY)  # noqa: B010
    limits = MergeLimits(memory_limit_mb=memory_limit_mb, spill_dir=spill)
    store = CountingStore(open_store(url))
    result = await read_hour_totals(store, HOUR, limits)
    gets = store.count("get", keys.index_catalog_hour_prefix(HOUR))
    return {"batches": result.batches, "setsum": result.setsum.hex[:16], "catalog_gets": gets}


async def settle(url: str) -> None:
    """Delete the inputs the hour's merged files name, as the compactor does after the
    readers' grace: the hour as a sealed hour's reader finds it."""
    deleted = await delete_compacted_inputs(open_store(url), HOUR, store_now_ns=2**62, grace_s=0.0)
    print(f"settled: {deleted} merged inputs deleted")


async def baseline(url: str) -> dict[str, object]:
    return {"rows": len((await read_hour(open_store(url), HOUR)).rows)}


def hour_ids(rows: int) -> pa.Array:
    """The ``manifest_id`` of every batch `seed` wrote, built 100,000 at a time."""
    chunks = []
    boot = "5f0c7a3e-1d2b-4c3a-9e8f-0123456789ab"
    for start in range(0, rows, 100_000):
        seq = np.arange(start, min(rows, start + 100_000), dtype=np.uint64)
        agents = pc.binary_join_element_wise(
            "agent-", pc.cast(pa.array((seq // 1000).astype(np.int64)), pa.string()), ""
        )
        identity = {"agent_id": agents, "boot_id": pa.repeat(pa.scalar(boot), len(seq))}
        identity |= {"seq_start": pa.array(seq), "seq_end": pa.array(seq)}
        chunks.append(manifest_ids(pa.table(identity)))
    return pa.chunked_array(chunks).combine_chunks()


async def spans(
    url: str, included: pa.Array, memory_limit_mb: int, spill: str
) -> dict[str, object]:
    """The live query's read of an hour's spans, out of core (`read_hour_spans`)."""
    limits = MergeLimits(memory_limit_mb=memory_limit_mb, spill_dir=spill)
    mins, maxs = await read_hour_spans(open_store(url), HOUR, included, limits)
    return {"batches": len(mins), "span_sum": int(mins.sum() % 2**61 + maxs.sum() % 2**61)}


async def spans_baseline(url: str, included: pa.Array) -> dict[str, object]:
    """The code `read_hour_spans` replaced: the hour's span columns in memory, grouped."""
    columns = ["key", "kind", "agent_id", "boot_id", "seq_start", "seq_end"]
    hour = await read_hour_table(open_store(url), HOUR, [*columns, "min_ts_ns", "max_ts_ns"])
    accepted = hour.accepted()
    table = pa.table(
        {
            "id": manifest_ids(accepted),
            "low": pc.fill_null(accepted.column("min_ts_ns"), LOWEST),
            "high": pc.fill_null(accepted.column("max_ts_ns"), HIGHEST),
        }
    )
    table = table.filter(pc.is_in(table.column("id"), value_set=included))
    per_batch = table.group_by("id").aggregate([("low", "min"), ("high", "max")])
    mins = per_batch.column("low_min").to_numpy()
    maxs = per_batch.column("high_max").to_numpy()
    return {"batches": len(mins), "span_sum": int(mins.sum() % 2**61 + maxs.sum() % 2**61)}


def _named(key: str) -> ObjectInfo:
    """A file known by name (`merge_files` reads its inputs by key)."""
    return ObjectInfo(key=key, size=0, etag="", last_modified_ns=0)


def child(argv: list[str]) -> None:
    what, url = argv[0], argv[1]
    if what.startswith("spans"):
        # The ledger's ids, held by the collector anyway: built first, and the peak
        # measured from there (building them peaks well above what they keep).
        included = hour_ids(int(argv[2]))
        pa.default_memory_pool().release_unused()
        child_process.reset_peak()

    def phase() -> dict[str, object]:
        if what == "levels":
            return asyncio.run(compact_by_levels(url, int(argv[2]), argv[3]))
        if what.startswith("totals"):
            options = {
                "aggregate": what == "totals-aggregate",
                "fetch_all": what == "totals-fetch-all",
                "struct": what == "totals-struct",
            }
            return asyncio.run(totals(url, int(argv[2]), argv[3], **options))
        if what == "spans":
            return asyncio.run(spans(url, included, int(argv[3]), argv[4]))
        if what == "spans-baseline":
            return asyncio.run(spans_baseline(url, included))
        return asyncio.run(baseline(url))

    print(json.dumps(child_process.measure(phase)))


def run_child(*args: str) -> dict[str, object]:
    return child_process.run_child("bench.catalog_hour", *args)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_600_000)
    parser.add_argument("--files", type=int, default=360)
    parser.add_argument("--baseline-rows", type=int, default=0)
    parser.add_argument("--memory-limit-mb", type=int, default=256)
    parser.add_argument("--phases", default=",".join(PHASES))
    args = parser.parse_args()
    phases = args.phases.split(",")
    if unknown := set(phases) - set(PHASES):
        parser.error(f"--phases: unknown {sorted(unknown)}; choose from {', '.join(PHASES)}")
    baseline_rows = args.baseline_rows or args.rows // 10
    limit = str(args.memory_limit_mb)
    print(f"load before: {os.getloadavg()}")
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="lm-bench-hour-") as tmp:
        big, small = f"file://{tmp}/big", f"file://{tmp}/small"
        started = time.perf_counter()
        asyncio.run(seed(big, args.rows, args.files))
        if "baseline" in phases:
            asyncio.run(seed(small, baseline_rows, max(1, args.files // 10)))
        print(f"seeded in {time.perf_counter() - started:.0f} s")
        spill = f"{tmp}/spill"
        Path(spill).mkdir()
        if "spans" in phases:  # before compaction: the hour as the steady pass wrote it
            results["hour's spans"] = run_child("spans", big, str(args.rows), limit, spill)
            results["spans, baseline"] = run_child("spans-baseline", big, str(args.rows))
        if "aggregate" in phases:  # before compaction: every key through the aggregate
            results["unmerged totals"] = run_child("totals", big, limit, spill)
            results["unmerged totals, struct"] = run_child("totals-struct", big, limit, spill)
        if "levels" in phases:
            results["compaction by levels"] = run_child("levels", big, limit, spill)
        if "grace" in phases:  # the merges' inputs still in the store, awaiting deletion
            results["grace totals"] = run_child("totals", big, limit, spill)
            results["grace totals, every file"] = run_child("totals-fetch-all", big, limit, spill)
        if "totals" in phases:
            if "levels" in phases:  # settled: the merges' inputs deleted after the grace
                asyncio.run(settle(big))
            results["hour totals"] = run_child("totals", big, limit, spill)
            if "levels" in phases:  # one merged file now: the same, with the aggregate
                results["hour totals, aggregate"] = run_child("totals-aggregate", big, limit, spill)
        if "baseline" in phases:
            results["baseline"] = run_child("baseline", small)
    report(results, rows=args.rows, baseline_rows=baseline_rows)
    print(f"load after: {os.getloadavg()}")


COMPARISONS = (  # (what, ours, the same run's baseline)
    ("merged hour's totals against the aggregate", "hour totals", "hour totals, aggregate"),
    (
        "unmerged hour's totals against the struct aggregate",
        "unmerged totals",
        "unmerged totals, struct",
    ),
    ("hour in the grace against fetching every file", "grace totals", "grace totals, every file"),
)


def report(results: dict[str, dict[str, object]], *, rows: int, baseline_rows: int) -> None:
    work = child_process.above_imports
    for name, result in results.items():
        rss = float(str(result["peak_rss"]))
        print(
            f"{name}: peak RSS {rss / 2**20:.0f} MiB ({work(result) / 2**20:.0f} MiB above the "
            f"imports), {float(str(result['seconds'])):.1f} s; {result}"
        )
    if "baseline" in results:
        per_row = work(results["baseline"]) / baseline_rows
        print(
            f"baseline: {per_row:.0f} B/row on {baseline_rows:,} rows, "
            f"{per_row * rows / 2**30:.2f} GiB scaled to {rows:,} rows"
        )
    for label, ours, baseline in COMPARISONS:
        if ours in results and baseline in results:
            new, old = results[ours], results[baseline]
            faster = float(str(old["seconds"])) / float(str(new["seconds"]))
            print(
                f"{label}: {faster:.2f}x sooner, {(work(old) - work(new)) / 2**20:.0f} MiB "
                f"less above the imports, {new['catalog_gets']} catalog GETs against "
                f"{old['catalog_gets']}"
            )
    if "hour's spans" in results:
        ratio = work(results["spans, baseline"]) / work(results["hour's spans"])
        print(f"spans: the baseline needs {ratio:.1f}x the memory above the imports")


if __name__ == "__main__":
    main()
