"""Synthetic inputs for `bench.join`: a catalog, a record listing and a blob listing of N
manifests on local disk, with known differences between them.

Layout of the data directory:

- ``catalog/index/v1/catalog/date=…/hour=HH/0000000001-<n>.parquet``: real catalog files
  (`index.rows.FILE_SCHEMA`, zstd, every row valid for `index.rows.check_row`), one file of
  ``rows_per_file`` rows per hour, as compaction leaves them;
- ``listing.parquet`` (``key``): every manifest and quarantine key, in S3 order, as the
  listing of ``accepted/v1/`` and ``quarantine/v1/`` would return them;
- ``blobs.parquet`` (``frame_sha256``, ``size``, ``last_modified_ns``): the listing of
  ``raw-blobs/v1/`` in S3 (hash) order;
- ``lost.parquet``: the manifests the catalog lacks (their log rows were "lost"), with
  their hashes, and ``expected.json``: what a correct join must find.

Differences planted (`Plan`): ``lost`` manifests listed but not cataloged; ``orphans``
blobs listed, referenced by nothing and older than the retry horizon (plus as many
young ones, which are not orphans yet); ``missing_blobs`` referenced hashes with no blob;
one quarantine record per ``quarantine_every`` manifests (both of its blobs listed).

Generation is vectorized per file (hex and key bytes built with NumPy); only the keys and
their BLAKE2b digests are made one by one, as the reconciler would.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from index.digests import key_digest
from index.rows import FILE_SCHEMA
from protocol import keys

HOUR_NS = 3600 * keys.NS_PER_S
FIRST_HOUR_NS = 1_700_000_000 // 3600 * HOUR_NS  # 2023-11-14T22:00Z
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


@dataclass(frozen=True)
class Plan:
    manifests: int
    rows_per_file: int = 10_000
    agents: int = 1_000
    lost: int = 1_000
    orphans: int = 1_000
    missing_blobs: int = 10
    quarantine_every: int = 100_000
    seed: int = 11

    @property
    def files(self) -> int:
        return -(-self.manifests // self.rows_per_file)

    def is_lost(self, index: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        return np.asarray(index % max(1, self.manifests // self.lost) == 7)

    def has_missing_blob(self, index: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        return np.asarray(index % max(1, self.manifests // self.missing_blobs) == 13)

    def is_quarantined(self, index: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        return np.asarray(index % self.quarantine_every == 29)


def hex_rows(raw: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """(n, k) bytes → (n, 2k) lowercase hex characters."""
    out = np.empty((raw.shape[0], raw.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2] = _HEX[raw >> 4]
    out[:, 1::2] = _HEX[raw & 15]
    return out


def strings(chars: npt.NDArray[np.uint8]) -> pa.StringArray:
    """(n, w) ASCII characters → a string array of n values of width w, zero-copy."""
    rows, width = chars.shape
    offsets = np.arange(0, (rows + 1) * width, width, dtype=np.int32)
    return pa.StringArray.from_buffers(
        rows, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(chars))
    )


def blob_keys(sha_hex: npt.NDArray[np.uint8]) -> pa.StringArray:
    """``raw-blobs/v1/sha256/<hh>/<hh>/<sha>.lmbatch`` for each row of hex hashes."""
    parts = [
        np.frombuffer(keys.RAW_BLOBS_PREFIX.encode(), np.uint8),
        None,
        np.frombuffer(b"/", np.uint8),
        None,
        np.frombuffer(b"/", np.uint8),
        None,
        np.frombuffer(b".lmbatch", np.uint8),
    ]
    columns = [sha_hex[:, 0:2], sha_hex[:, 2:4], sha_hex]
    pieces = [
        np.broadcast_to(part, (len(sha_hex), len(part))) if part is not None else columns.pop(0)
        for part in parts
    ]
    return strings(np.concatenate(pieces, axis=1))


class _Identities:
    """Manifest ``i`` is agent ``i % agents``, sequence number ``i // agents``."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.agent_ids = [f"agent-{a:05d}" for a in range(plan.agents)]
        self.boot_ids = [str(uuid.UUID(int=a + 1)) for a in range(plan.agents)]
        self.prefixes = [
            keys.accepted_manifest_key(keys.BatchIdentity(agent, uuid.UUID(boot), 0, 0))[:-46]
            for agent, boot in zip(self.agent_ids, self.boot_ids, strict=True)
        ]

    def key(self, index: int) -> str:
        agent, seq = index % self.plan.agents, index // self.plan.agents
        return f"{self.prefixes[agent]}{seq * 10:020d}-{seq * 10 + 9:020d}.json"

    def quarantine_key(self, index: int, sha: str) -> str:
        return (
            self.key(index)
            .removesuffix(".json")
            .replace(keys.ACCEPTED_PREFIX, keys.QUARANTINE_PREFIX, 1)
            + f"/{sha}.json"
        )


def _file_table(
    ids: _Identities, index: npt.NDArray[np.int64], sha_hex: npt.NDArray[np.uint8], hour: int
) -> pa.Table:
    plan = ids.plan
    agents, seqs = index % plan.agents, index // plan.agents
    key_list = [ids.key(int(i)) for i in index]
    times = FIRST_HOUR_NS + hour * HOUR_NS + (np.arange(len(index)) * (HOUR_NS // len(index)))
    columns = {
        "kind": pa.array(["accepted"] * len(index)),
        "key": pa.array(key_list, pa.string()),
        "frame_sha256": strings(sha_hex),
        "accepted_frame_sha256": pa.nulls(len(index), pa.string()),
        "raw_blob_key": blob_keys(sha_hex),
        "agent_id": pa.array([ids.agent_ids[a] for a in agents], pa.string()),
        "boot_id": pa.array([ids.boot_ids[a] for a in agents], pa.string()),
        "seq_start": pa.array(seqs * 10, pa.uint64()),
        "seq_end": pa.array(seqs * 10 + 9, pa.uint64()),
        "record_count": pa.array(np.full(len(index), 10), pa.int64()),
        "frame_bytes": pa.array(np.full(len(index), 65_536), pa.int64()),
        "time_unix_ns": pa.array(times, pa.int64()),
        "key_digest": pa.array([key_digest(k) for k in key_list], pa.binary(16)),
    }
    shas = columns["frame_sha256"].to_pylist()
    return _attested(columns, [f'"{sha[:32]}"' for sha in shas])


def _attested(columns: dict[str, object], etags: list[str]) -> pa.Table:
    """The store-attested columns (PROTOCOL §3.7): an ETag a row (as a store's MD5 looks),
    the rest null (rows an audit or read-back wrote)."""
    count = len(etags)
    columns = {
        **columns,
        "etag": pa.array(etags, pa.string()),
        "own_create": pa.nulls(count, pa.bool_()),
        "min_ts_ns": pa.nulls(count, pa.int64()),
        "max_ts_ns": pa.nulls(count, pa.int64()),
        "source": pa.nulls(count, pa.string()),
    }
    return pa.Table.from_pydict(columns, schema=FILE_SCHEMA)


def _quarantine_table(ids: _Identities, rows: list[tuple[int, str, str]], hour: int) -> pa.Table:
    """Quarantine rows ``(manifest index, accepted sha, submitted sha)``."""
    plan = ids.plan
    quarantine_keys = [ids.quarantine_key(i, sub) for i, _acc, sub in rows]
    columns = {
        "kind": ["quarantine"] * len(rows),
        "key": quarantine_keys,
        "frame_sha256": [sub for _i, _acc, sub in rows],
        "accepted_frame_sha256": [acc for _i, acc, _sub in rows],
        "raw_blob_key": [keys.raw_blob_key(sub) for _i, _acc, sub in rows],
        "agent_id": [ids.agent_ids[i % plan.agents] for i, _a, _s in rows],
        "boot_id": [ids.boot_ids[i % plan.agents] for i, _a, _s in rows],
        "seq_start": [i // plan.agents * 10 for i, _a, _s in rows],
        "seq_end": [i // plan.agents * 10 + 9 for i, _a, _s in rows],
        "record_count": [None] * len(rows),
        "frame_bytes": [None] * len(rows),
        "time_unix_ns": [FIRST_HOUR_NS + hour * HOUR_NS + 1] * len(rows),
        "key_digest": [key_digest(k) for k in quarantine_keys],
    }
    return _attested(columns, [f'"{sub[:32]}"' for _i, _acc, sub in rows])


def generate(plan: Plan, data_dir: Path, *, now_ns: int, horizon_s: float) -> dict[str, object]:
    """Write the data set; returns (and writes to ``expected.json``) what the join must find."""
    rng = np.random.default_rng(plan.seed)
    ids = _Identities(plan)
    catalog_root = data_dir / "catalog"
    shas = np.empty((plan.manifests, 32), dtype=np.uint8)
    lost_rows: list[dict[str, object]] = []
    quarantine_keys: list[str] = []
    extra_blobs: list[bytes] = []  # submitted blobs of quarantine records
    for hour in range(plan.files):
        index = np.arange(
            hour * plan.rows_per_file, min(plan.manifests, (hour + 1) * plan.rows_per_file)
        )
        shas[index] = np.frombuffer(rng.bytes(32 * len(index)), np.uint8).reshape(-1, 32)
        sha_hex = hex_rows(shas[index])
        table = _file_table(ids, index, sha_hex, hour)
        lost = plan.is_lost(index)
        for i in np.flatnonzero(lost):
            lost_rows.append(
                {
                    "key": table["key"][i].as_py(),
                    "sha": table["frame_sha256"][i].as_py(),
                    "time": table["time_unix_ns"][i].as_py(),
                }
            )
        table = table.filter(pa.array(~lost))
        quarantined = [
            (int(i), bytes(hex_rows(shas[i : i + 1])[0]).decode(), rng.bytes(32).hex())
            for i in index[plan.is_quarantined(index)]
        ]
        if quarantined:
            table = pa.concat_tables([table, _quarantine_table(ids, quarantined, hour)])
            quarantine_keys.extend(ids.quarantine_key(i, sub) for i, _a, sub in quarantined)
            extra_blobs.extend(bytes.fromhex(sub) for _i, _a, sub in quarantined)
        hour_key = keys.index_catalog_key(
            keys.UtcHour.from_unix_ns(FIRST_HOUR_NS + hour * HOUR_NS), 1, hour + 1
        )
        path = catalog_root / hour_key
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, compression="zstd")
    _write_listing(ids, data_dir / "listing.parquet", quarantine_keys)
    missing_blob = plan.has_missing_blob(np.arange(plan.manifests))
    orphans = np.frombuffer(rng.bytes(32 * 2 * plan.orphans), np.uint8).reshape(-1, 32)
    old_ns = now_ns - int(2 * horizon_s * keys.NS_PER_S)
    blobs = np.concatenate(
        [
            shas[~missing_blob],
            np.frombuffer(b"".join(extra_blobs), np.uint8).reshape(-1, 32),
            orphans,
        ]
    )
    modified = np.concatenate(
        [
            np.full(len(blobs) - 2 * plan.orphans, old_ns, np.int64),
            np.full(plan.orphans, old_ns, np.int64),  # old orphans: the join must report them
            np.full(plan.orphans, now_ns, np.int64),  # young ones: not yet
        ]
    )
    order = np.argsort(blobs[:, :8].copy().view(">u8").ravel())
    pq.write_table(
        pa.table(
            {
                "frame_sha256": strings(hex_rows(blobs[order])),
                "size": pa.array(np.full(len(blobs), 65_536), pa.int64()),
                "last_modified_ns": pa.array(modified[order], pa.int64()),
            }
        ),
        data_dir / "blobs.parquet",
        compression="zstd",
    )
    pq.write_table(pa.Table.from_pylist(lost_rows), data_dir / "lost.parquet")
    expected: dict[str, object] = {
        "plan": asdict(plan),
        "now_ns": now_ns,
        "catalog_files": plan.files,
        "listed_records": plan.manifests + len(quarantine_keys),
        "listed_blobs": len(blobs),
        "lost": sorted(str(row["key"]) for row in lost_rows),
        "orphans": sorted(
            bytes(hex_rows(orphans[: plan.orphans])[i]).decode() for i in range(plan.orphans)
        ),
        "missing_blobs": sorted(
            bytes(hex_rows(shas[i : i + 1])[0]).decode() for i in np.flatnonzero(missing_blob)
        ),
    }
    (data_dir / "expected.json").write_text(json.dumps(expected))
    return expected


def _write_listing(ids: _Identities, path: Path, quarantine_keys: list[str]) -> None:
    """Every record key in S3 order: agent by agent (their prefixes sort like their
    numbers), sequence numbers ascending, then the quarantine prefix (which sorts after
    ``accepted/``), the way the audit's walk meets them."""
    plan = ids.plan
    schema = pa.schema([("key", pa.string())])
    with pq.ParquetWriter(path, schema, compression="zstd") as writer:
        for agent in range(plan.agents):
            index = range(agent, plan.manifests, plan.agents)
            writer.write_table(
                pa.table({"key": pa.array([ids.key(i) for i in index], pa.string())})
            )
        writer.write_table(pa.table({"key": pa.array(sorted(quarantine_keys), pa.string())}))
