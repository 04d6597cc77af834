"""The full audit's statements about bundles (PROTOCOL §3.10), over the views of
`reconciler.audit.engines.sql` (both engines run them, as that module's): `BAD_RANGE_IDS`
then `BAD_RANGES` (rows whose range does not fit in the listed size of the bundle they
name: ``bad-range``), and `BUNDLE_BYTES` (per listed bundle, its size and the bytes of
the distinct ranges rows name in it; dead bytes are the rest, no GET). Run after the blob
join, over ``catalog_rows`` and ``added_rows`` (rows the audit wrote count too)."""

from __future__ import annotations

from protocol.bundle import ENTRY_LEN, FOOTER_LEN
from reconciler.audit.engines.sql import BUNDLES

_BUNDLE_REFS = """
SELECT key, raw_id, raw_offset, raw_length FROM catalog_rows WHERE raw_offset IS NOT NULL
UNION ALL
SELECT key, raw_id, raw_offset, raw_length FROM added_rows WHERE raw_offset IS NOT NULL
"""
"""Rows naming a range of a bundle (any kind: as for `REFERENCED`)."""

RANGE_TAIL = ENTRY_LEN + FOOTER_LEN
"""Bytes after a bundle's data part, at least: one index entry and the footer
(`protocol.bundle.check_range`): a range must end that far before the listed size."""

BAD_RANGE_IDS = f"""
SELECT DISTINCT r.raw_id AS raw_id, r.raw_offset AS raw_offset, r.raw_length AS raw_length,
       b.size AS size
FROM (SELECT raw_id, raw_offset, raw_length FROM ({_BUNDLE_REFS}) a) r
JOIN (SELECT raw_id, size FROM ({BUNDLES}) l) b ON r.raw_id = b.raw_id
WHERE r.raw_offset + r.raw_length + {RANGE_TAIL} > b.size
"""
"""Ranges that end past the listed size of the bundle they name (less its index entry
and footer), fixed-size columns only; kept as the table ``bad_range_ids`` (few)."""

BAD_RANGES = f"""
SELECT min(r.key) AS record_key, min(l.key) AS raw_key, CAST(x.raw_offset AS BIGINT) AS raw_offset,
       CAST(x.raw_length AS BIGINT) AS raw_length, CAST(x.size AS BIGINT) AS size
FROM bad_range_ids x
JOIN ({_BUNDLE_REFS}) r
  ON r.raw_id = x.raw_id AND r.raw_offset = x.raw_offset AND r.raw_length = x.raw_length
JOIN ({BUNDLES}) l ON l.raw_id = x.raw_id
GROUP BY x.raw_id, x.raw_offset, x.raw_length, x.size
"""
"""``bad-range`` candidates (``bad_ranges.parquet``): a record naming each bad range, the
bundle's key, the range and the listed size. PROTOCOL §3.10 says ``raw_offset +
raw_length <= size``; the data part ends before the bundle's index (an entry a frame)
and footer, so the bound here is that much tighter (`RANGE_TAIL`), as a reader's
`protocol.bundle.check_range` with the object's size."""

BUNDLE_BYTES = f"""
SELECT l.key AS raw_key, CAST(l.size AS BIGINT) AS size,
       CAST(coalesce(n.live_bytes, 0) AS BIGINT) AS live_bytes,
       CAST(coalesce(n.frames, 0) AS BIGINT) AS frames,
       CAST(CASE WHEN l.size > coalesce(n.live_bytes, 0) THEN l.size - coalesce(n.live_bytes, 0)
                 ELSE 0 END AS BIGINT) AS dead_bytes,
       coalesce(t.any_retired AND NOT t.all_retired, false) AS pinned
FROM ({BUNDLES}) l
LEFT JOIN (
  SELECT raw_id, bool_or(retired) AS any_retired, bool_and(retired) AS all_retired FROM (
    SELECT raw_id, retired FROM catalog_rows WHERE raw_offset IS NOT NULL
    UNION ALL
    SELECT raw_id, false AS retired FROM added_rows WHERE raw_offset IS NOT NULL
  ) r
  GROUP BY raw_id
) t ON l.raw_id = t.raw_id
LEFT JOIN (
  SELECT raw_id, CAST(sum(raw_length) AS BIGINT) AS live_bytes, count(*) AS frames FROM (
    SELECT DISTINCT raw_id, raw_offset, raw_length FROM ({_BUNDLE_REFS}) a
  ) d
  GROUP BY raw_id
) n ON l.raw_id = n.raw_id
"""
"""Per listed bundle (``bundles.parquet``): its listed size, the bytes of the distinct
ranges rows name in it (``live_bytes``, ``frames``), ``dead_bytes`` = size less those
(PROTOCOL §3.10: no GET; the index and footer count as dead, 12 + 44 bytes a frame), and
``pinned``: raw retention retired some rows naming it but not all (a bundle goes only
whole, so a frame that never retires keeps it all). A bundle's frames are about 1 % of the manifests, so the key strings are
carried here."""
