"""The orphan file of a completed catalog audit (``reconciler/v1/audit-orphans/…``).

One Parquet row per raw object (frame blob or bundle, PROTOCOL §3.10) the audit's listing
showed older than the retry horizon and referenced by no catalog row (joined by key):
``frame_sha256`` (the hash in its key: a bundle's own for a bundle), ``size``,
``last_modified_ns`` (the listing's LastModified, store time), ``raw_retention`` (true
when only accepted rows of retired hours reference it, `reconciler.gc.raw_retention`;
files written before that column existed read as false) and ``raw_blob_key`` (a bundle's
key; null for a frame blob, the one of its hash, and absent in files written before
bundles: `reconciler.gc.candidates.RAW_KEY_COLUMNS`). The GC proves rules 1 and 2 of
PROTOCOL §3.5 from it.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

ORPHAN_SCHEMA = pa.schema(
    [
        ("frame_sha256", pa.string()),
        ("size", pa.int64()),
        ("last_modified_ns", pa.int64()),
        ("raw_retention", pa.bool_()),
        ("raw_blob_key", pa.string()),
    ]
)
Orphan = tuple[str, int, int, bool]
"""``(frame_sha256, size, last_modified_ns, raw_retention)`` of a frame blob."""


def encode_orphans(orphans: list[Orphan]) -> bytes:
    table = pa.Table.from_pydict(
        {
            "frame_sha256": [sha for sha, _size, _modified, _r in orphans],
            "size": [size for _sha, size, _modified, _r in orphans],
            "last_modified_ns": [modified for _sha, _size, modified, _r in orphans],
            "raw_retention": [retired for _sha, _size, _modified, retired in orphans],
            "raw_blob_key": [None] * len(orphans),
        },
        schema=ORPHAN_SCHEMA,
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def decode_orphans(body: bytes) -> dict[str, tuple[int, int, bool]]:
    """Orphan file → ``{sha: (size, last_modified_ns, raw_retention)}``. Raises
    `ValueError` when unreadable."""
    try:
        table = pq.read_table(io.BytesIO(body))
        data = table.select(ORPHAN_SCHEMA.names[:3]).to_pydict()
    except (pa.ArrowException, OSError, KeyError) as exc:
        raise ValueError(f"unreadable orphan file: {exc}") from None
    retired = (
        table.column("raw_retention").fill_null(False).to_pylist()
        if "raw_retention" in table.column_names
        else [False] * table.num_rows
    )
    return {
        sha: (size, modified, bool(by_retention))
        for sha, size, modified, by_retention in zip(
            data["frame_sha256"], data["size"], data["last_modified_ns"], retired, strict=True
        )
    }
