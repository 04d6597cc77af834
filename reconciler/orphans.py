"""The orphan file of a completed catalog audit (``reconciler/v1/audit-orphans/…``).

One Parquet row per raw blob the audit's listing showed older than the retry horizon and
referenced by no catalog row: ``frame_sha256``, ``size``, ``last_modified_ns`` (the
listing's LastModified, store time). The GC proves rules 1 and 2 of PROTOCOL §3.5 from it.
"""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

ORPHAN_SCHEMA = pa.schema(
    [("frame_sha256", pa.string()), ("size", pa.int64()), ("last_modified_ns", pa.int64())]
)
Orphan = tuple[str, int, int]
"""``(frame_sha256, size, last_modified_ns)``."""


def encode_orphans(orphans: list[Orphan]) -> bytes:
    table = pa.Table.from_pydict(
        {
            "frame_sha256": [sha for sha, _size, _modified in orphans],
            "size": [size for _sha, size, _modified in orphans],
            "last_modified_ns": [modified for _sha, _size, modified in orphans],
        },
        schema=ORPHAN_SCHEMA,
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def decode_orphans(body: bytes) -> dict[str, tuple[int, int]]:
    """Orphan file → ``{sha: (size, last_modified_ns)}``. Raises `ValueError` when unreadable."""
    try:
        table = pq.read_table(io.BytesIO(body), columns=ORPHAN_SCHEMA.names)
    except (pa.ArrowException, OSError, KeyError) as exc:
        raise ValueError(f"unreadable orphan file: {exc}") from None
    data = table.to_pydict()
    return {
        sha: (size, modified)
        for sha, size, modified in zip(
            data["frame_sha256"], data["size"], data["last_modified_ns"], strict=True
        )
    }
