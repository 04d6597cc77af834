"""Synthetic inputs for `bench.join`: N manifests as pinned catalog files and listing parts
on local disk, with known differences between them, generated column-wise (NumPy and
pyarrow: no Python object per row).

Layout of the data directory:

- ``catalog/index/v1/catalog/date=…/hour=HH/0000000001-<n>.parquet``: catalog files of
  ``rows_per_file`` rows, one per hour, every `index.rows.FILE_SCHEMA` column (the joins
  read six of them);
- ``listing/<kind>-<n>.parquet``: the audit's listing parts (`reconciler.audit.engines.duckdb_joins`'s
  schema: ``key``, ``etag``, ``size``, ``last_modified``) of ``accepted``, ``quarantine``
  and ``raw-blobs``, at most `PART_ROWS` rows each;
- ``expected.json``: what the joins must find.

Manifest ``i`` is agent ``i % agents``, sequence ``i // agents``, cataloged in hour
``i // rows_per_file``. Differences planted (`Plan`, each ``per_kind`` times, spread over
the whole range): ``missing`` listed, not cataloged; ``etag`` listed with another ETag
than its row's; ``two_hours`` a second row in the next hour's file; ``two_hashes`` a
second row with another hash in the same file (its blob listed); ``phantom`` cataloged,
not listed; ``missing_blob`` its blob not listed; ``orphans`` unreferenced blobs, old
(reported) and as many young ones (not yet); ``young`` records listed after the audit's
start (the steady pass's: not reported). One quarantine record per
``quarantine_every`` manifests (cataloged, listed, both blobs listed).
"""

from __future__ import annotations

import json
import multiprocessing
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from index.rows import FILE_SCHEMA
from protocol import keys

HOUR_NS = 3600 * keys.NS_PER_S
FIRST_HOUR_NS = 1_700_000_000 // 3600 * HOUR_NS  # 2023-11-14T22:00Z
PART_ROWS = 1_000_000
BOOT_HEX = "0123456789abcdef0123456789abcdef"
LISTING_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("etag", pa.string()),
        ("size", pa.int64()),
        ("last_modified", pa.timestamp("us", tz="UTC")),
    ]
)
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
KINDS = ("missing", "etag", "two_hours", "two_hashes", "phantom", "missing_blob")
U8 = npt.NDArray[np.uint8]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Plan:
    manifests: int
    rows_per_file: int = 10_000
    agents: int = 1_000
    per_kind: int = 100
    orphans: int = 1_000
    young: int = 100
    quarantine_every: int = 100_000
    seed: int = 11

    @property
    def files(self) -> int:
        return -(-self.manifests // self.rows_per_file)

    def planted(self, index: I64) -> dict[str, npt.NDArray[np.bool_]]:
        """Which manifests of ``index`` carry each difference (disjoint residues)."""
        step = max(len(KINDS) + 8, self.manifests // self.per_kind)
        residue = index % step
        return {kind: residue == 3 + n for n, kind in enumerate(KINDS)}

    def is_quarantined(self, index: I64) -> npt.NDArray[np.bool_]:
        return np.asarray(index % self.quarantine_every == 1)


def hex_rows(raw: U8) -> U8:
    """(n, k) bytes → (n, 2k) lowercase hex characters."""
    out = np.empty((raw.shape[0], raw.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = _HEX[raw >> 4]
    out[:, 1::2] = _HEX[raw & 15]
    return out


def digits(values: I64, width: int) -> U8:
    """Zero-padded decimal characters of non-negative ``values``, (n, width)."""
    out = np.empty((len(values), width), dtype=np.uint8)
    rest = values.astype(np.uint64)
    for j in range(width - 1, -1, -1):
        out[:, j] = (rest % np.uint64(10)).astype(np.uint8) + 48
        rest //= np.uint64(10)
    return out


def const(text: str, rows: int) -> U8:
    return np.broadcast_to(np.frombuffer(text.encode(), np.uint8), (rows, len(text)))


def strings(*pieces: U8) -> pa.StringArray:
    """Row-wise concatenation of (n, w) ASCII pieces → n strings, zero-copy."""
    chars = np.ascontiguousarray(np.concatenate(pieces, axis=1))
    rows, width = chars.shape
    offsets = np.arange(0, (rows + 1) * width, width, dtype=np.int64)
    return pa.LargeStringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(chars)).cast(
        pa.string()
    )


def manifest_keys(plan: Plan, index: I64) -> pa.StringArray:
    """``accepted/v1/agent=agent-NNNNN/boot=<hex>/<seq*10>-<seq*10+9>.json``."""
    n = len(index)
    seq = (index // plan.agents) * 10
    return strings(
        const("accepted/v1/agent=agent-", n),
        digits(index % plan.agents, 5),
        const(f"/boot={BOOT_HEX}/", n),
        digits(seq, 20),
        const("-", n),
        digits(seq + 9, 20),
        const(".json", n),
    )


def quarantine_keys(plan: Plan, index: I64, submitted_hex: U8) -> pa.StringArray:
    n = len(index)
    seq = (index // plan.agents) * 10
    return strings(
        const("quarantine/v1/identity-conflict/agent=agent-", n),
        digits(index % plan.agents, 5),
        const(f"/boot={BOOT_HEX}/", n),
        digits(seq, 20),
        const("-", n),
        digits(seq + 9, 20),
        const("/", n),
        submitted_hex,
        const(".json", n),
    )


def blob_keys(sha_hex: U8) -> pa.StringArray:
    n = len(sha_hex)
    return strings(
        const(keys.RAW_BLOBS_PREFIX, n),
        sha_hex[:, 0:2],
        const("/", n),
        sha_hex[:, 2:4],
        const("/", n),
        sha_hex,
        const(".lmbatch", n),
    )


def etags(sha_hex: U8) -> pa.StringArray:
    n = len(sha_hex)
    return strings(const('"', n), sha_hex[:, :32], const('"', n))


def catalog_table(
    kind: str, key: pa.Array, sha_hex: U8, accepted_hex: U8 | None, times: I64
) -> pa.Table:
    n = len(key)
    null_str = pa.nulls(n, pa.string())
    columns: dict[str, pa.Array] = {
        "kind": pa.array(np.full(n, kind, dtype=object), pa.string()),
        "key": key,
        "frame_sha256": strings(sha_hex),
        "accepted_frame_sha256": strings(accepted_hex) if accepted_hex is not None else null_str,
        "raw_blob_key": blob_keys(sha_hex),
        "agent_id": null_str,
        "boot_id": pa.array(np.full(n, BOOT_HEX, dtype=object), pa.string()),
        "seq_start": pa.array(np.zeros(n, np.uint64)),
        "seq_end": pa.array(np.full(n, 9, np.uint64)),
        "record_count": pa.array(np.full(n, 10, np.int64)),
        "frame_bytes": pa.array(np.full(n, 65_536, np.int64)),
        "time_unix_ns": pa.array(times, pa.int64()),
        "etag": etags(sha_hex),
        "own_create": pa.nulls(n, pa.bool_()),
        "min_ts_ns": pa.nulls(n, pa.int64()),
        "max_ts_ns": pa.nulls(n, pa.int64()),
        "source": null_str,
        "key_digest": pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(16), n, [None, pa.py_buffer(np.zeros(16 * n, np.uint8))]
        ),
    }
    # Columns not given (the rows' rank, ranges: PROTOCOL §3.10) are null.
    full = {f.name: columns.get(f.name, pa.nulls(n, f.type)) for f in FILE_SCHEMA}
    return pa.Table.from_pydict(full, schema=FILE_SCHEMA)


class _Parts:
    """Listing parts of one kind, `PART_ROWS` rows each."""

    def __init__(self, directory: Path, kind: str) -> None:
        self.directory, self.kind = directory, kind
        self.paths: list[str] = []
        self._writer: pq.ParquetWriter | None = None
        self._rows = 0

    def add(self, key: pa.Array, etag: pa.Array, modified_ns: I64) -> None:
        if self._writer is None or self._rows >= PART_ROWS:
            self.close()
            path = self.directory / f"{self.kind}-{len(self.paths):05d}.parquet"
            self.paths.append(str(path))
            self._writer = pq.ParquetWriter(
                path, LISTING_SCHEMA, compression="zstd", compression_level=1
            )
            self._rows = 0
        table = pa.table(
            {
                "key": key,
                "etag": etag,
                "size": pa.array(np.full(len(key), 65_536, np.int64)),
                "last_modified": pa.array(modified_ns // 1000, pa.int64()).cast(
                    pa.timestamp("us", tz="UTC")
                ),
            },
            schema=LISTING_SCHEMA,
        )
        self._writer.write_table(table)
        self._rows += len(key)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _in_hour(table: pa.Table, hour: int) -> pa.Table:
    times = np.full(table.num_rows, FIRST_HOUR_NS + hour * HOUR_NS + 1, np.int64)
    return table.set_column(11, "time_unix_ns", pa.array(times, pa.int64()))


def _write_catalog(data_dir: Path, hour: int, sequence: int, tables: list[pa.Table]) -> None:
    name = keys.index_catalog_key(
        keys.UtcHour.from_unix_ns(FIRST_HOUR_NS + hour * HOUR_NS), 1, sequence
    )
    path = data_dir / "catalog" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.concat_tables(tables), path, compression="zstd", compression_level=1)


def _take(array: pa.Array, mask: npt.NDArray[np.bool_]) -> list[str]:
    return [str(v) for v in array.filter(pa.array(mask)).to_pylist()]


Expected = dict[str, list[str]]
EXPECTED_KINDS = (*KINDS, "missing_blob_sha", "orphan", "quarantine")


def _hours(
    args: tuple[Plan, Path, int, int, int, int],
) -> tuple[Expected, dict[str, list[str]]]:
    """Hours ``[first, end)``: catalog files and listing parts (chunk ``chunk``)."""
    plan, data_dir, chunk, first, end, old_ns = args
    rng = np.random.default_rng((plan.seed, chunk))
    listing = data_dir / "listing"
    parts = {
        k: _Parts(listing, f"{k}-{chunk:04d}") for k in ("accepted", "quarantine", "raw-blobs")
    }
    expected: Expected = {kind: [] for kind in EXPECTED_KINDS}
    for hour in range(first, end):
        index = np.arange(
            hour * plan.rows_per_file, min(plan.manifests, (hour + 1) * plan.rows_per_file)
        )
        n = len(index)
        planted = plan.planted(index)
        sha_hex = hex_rows(rng.integers(0, 256, (n, 32), dtype=np.uint8))
        key = manifest_keys(plan, index)
        times = FIRST_HOUR_NS + hour * HOUR_NS + np.arange(n, dtype=np.int64) * (HOUR_NS // n)
        cataloged = ~planted["missing"]
        tables = [catalog_table("accepted", key, sha_hex, None, times).filter(pa.array(cataloged))]
        two_hours = planted["two_hours"]
        if two_hours.any():  # a later file of the next hour
            again = catalog_table(
                "accepted",
                key.filter(pa.array(two_hours)),
                sha_hex[two_hours],
                None,
                times[two_hours],
            )
            _write_catalog(data_dir, hour + 1, 1_000_000_000 + hour, [_in_hour(again, hour + 1)])
        two = planted["two_hashes"]
        other_hex = hex_rows(rng.integers(0, 256, (int(two.sum()), 32), dtype=np.uint8))
        if two.any():
            tables.append(
                catalog_table("accepted", key.filter(pa.array(two)), other_hex, None, times[two])
            )
        quarantined = plan.is_quarantined(index)
        submitted_hex = hex_rows(rng.integers(0, 256, (int(quarantined.sum()), 32), np.uint8))
        if quarantined.any():
            q_key = quarantine_keys(plan, index[quarantined], submitted_hex)
            tables.append(
                catalog_table(
                    "quarantine", q_key, submitted_hex, sha_hex[quarantined], times[quarantined]
                )
            )
            parts["quarantine"].add(q_key, etags(submitted_hex), np.full(len(q_key), old_ns))
            expected["quarantine"].extend(q_key.to_pylist())
        _write_catalog(data_dir, hour, hour + 1, tables)
        # The record listing: all but the phantoms, some with another ETag.
        listed = ~planted["phantom"]
        listed_etag = etags(np.where(planted["etag"][:, None], np.uint8(ord("f")), sha_hex))
        parts["accepted"].add(
            key.filter(pa.array(listed)),
            listed_etag.filter(pa.array(listed)),
            np.full(int(listed.sum()), old_ns),
        )
        # The blob listing: every blob but the missing ones, the second hashes, the
        # quarantine records' submitted blobs.
        has_blob = ~planted["missing_blob"] & cataloged
        blobs = np.concatenate([sha_hex[has_blob], other_hex, submitted_hex])
        parts["raw-blobs"].add(blob_keys(blobs), etags(blobs), np.full(len(blobs), old_ns))
        for kind in KINDS:
            expected[kind].extend(_take(key, planted[kind]))
        expected["missing_blob_sha"].extend(
            bytes(r).decode() for r in sha_hex[planted["missing_blob"] & cataloged]
        )
    for part in parts.values():
        part.close()
    return expected, {kind: part.paths for kind, part in parts.items()}


def generate(
    plan: Plan, data_dir: Path, *, start_ns: int, horizon_s: float, workers: int = 2
) -> dict[str, object]:
    """Write the data set (hours in chunks, ``workers`` processes); returns (and writes to
    ``expected.json``) what the joins must find. ``start_ns``: the audit's start (records
    are older, the young ones newer)."""
    listing = data_dir / "listing"
    listing.mkdir(parents=True, exist_ok=True)
    old_ns = start_ns - int(2 * horizon_s * keys.NS_PER_S)
    chunks = max(1, min(plan.files, 4 * workers))
    bounds = np.linspace(0, plan.files, chunks + 1).astype(int)
    jobs = [(plan, data_dir, c, int(bounds[c]), int(bounds[c + 1]), old_ns) for c in range(chunks)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        done = pool.map(_hours, jobs)
    expected: Expected = {kind: [] for kind in EXPECTED_KINDS}
    paths: dict[str, list[str]] = {"accepted": [], "quarantine": [], "raw-blobs": []}
    for chunk_expected, chunk_paths in done:
        for kind, values in chunk_expected.items():
            expected[kind].extend(values)
        for kind, values in chunk_paths.items():
            paths[kind].extend(values)
    rng = np.random.default_rng((plan.seed, chunks))
    extra = {k: _Parts(listing, f"{k}-extra") for k in ("accepted", "raw-blobs")}
    orphan_hex = hex_rows(rng.integers(0, 256, (2 * plan.orphans, 32), dtype=np.uint8))
    modified = np.concatenate(
        [np.full(plan.orphans, old_ns), np.full(plan.orphans, start_ns)]
    ).astype(np.int64)
    extra["raw-blobs"].add(blob_keys(orphan_hex), etags(orphan_hex), modified)
    expected["orphan"] = [bytes(r).decode() for r in orphan_hex[: plan.orphans]]
    young = np.arange(plan.manifests, plan.manifests + plan.young, dtype=np.int64)
    extra["accepted"].add(
        manifest_keys(plan, young),
        etags(hex_rows(rng.integers(0, 256, (plan.young, 32), dtype=np.uint8))),
        np.full(plan.young, start_ns + 3600 * keys.NS_PER_S),
    )
    for kind, part in extra.items():
        part.close()
        paths[kind].extend(part.paths)
    result: dict[str, object] = {
        "plan": asdict(plan),
        "start_ns": start_ns,
        "catalog_files": sum(1 for _ in (data_dir / "catalog").rglob("*.parquet")),
        "listing": paths,
        "expected": {kind: sorted(values) for kind, values in expected.items()},
    }
    (data_dir / "expected.json").write_text(json.dumps(result))
    return result
