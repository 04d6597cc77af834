"""The full audit's joins as SQL text (PROTOCOL §3.7, §3.9 "full audit", §3.5 rule 5).

One engine runs them today (`reconciler.audit.engines.duckdb_joins`, DuckDB); the text is written for the
Spark engine to run as well, over views of the same names and columns:

- ``listing(kind, key, etag, size, last_modified_ns, key_id, etag_id, raw_id)``: the
  audit's listing parts (`reconciler.audit.listing.LISTING_SCHEMA`, ``last_modified`` as
  integer nanoseconds through `listed_modified_ns`: a record without one counts as old),
  ``kind`` one of ``accepted``, ``quarantine``, ``raw-blobs``, ``raw-bundles``;
- ``catalog_rows(key, kind, etag, frame_sha256, accepted_frame_sha256, raw_blob_key,
  raw_offset, raw_length, time_unix_ns, sha_prefix, key_id, etag_id, raw_id,
  accepted_raw_id, row_rank, write_rank, retired)``:
  every row of the catalog files the audit pinned, with ``row_rank`` unique a row (its
  copy's place and its row number: how a row found is fetched back), ``write_rank`` the
  row's rank as one fixed-size number (`index.catalog_rank`, rendered for each engine:
  the row of a key with the highest counts, PROTOCOL §3.7), ``sha_prefix`` (the first 60 bits of
  ``frame_sha256`` as a ``BIGINT``) and ``retired`` (an accepted row of an hour raw
  retention retired and that still holds, `reconciler.gc.raw_retention`: it keeps no
  blob alive);
- ``added_rows(key, frame_sha256, accepted_frame_sha256, raw_blob_key, raw_offset,
  raw_length, raw_id, accepted_raw_id)``: rows the audit wrote after the record join.

Raw objects are joined by **key** (PROTOCOL §3.7, §3.10), never by a frame's hash: a
row's raw object is its ``raw_blob_key`` (`row_raw_key`: the bundle for a bundled frame,
else the frame blob of ``frame_sha256``), a quarantine row's accepted side the frame blob
of ``accepted_frame_sha256`` (a quarantine record names frame blobs only); a listed raw
object is its key, under ``raw-blobs/v1/`` or ``raw-bundles/v1/``.

The big joins and aggregates run on fixed-size ids the views compute, never on strings
(a string-keyed aggregate or join over 50M keys did not fit 512 MB in DuckDB): ``key_id``
a 128-bit digest of ``key`` (the catalog's ``key_digest``), ``raw_id``/``accepted_raw_id``
a 128-bit digest of a raw object's key (a listed one's, or `row_raw_key`), ``etag_id``
a 64-bit hash of the normalized ETag (`normalized_etag`; null for no ETag). The
dialect-specific parts (digests, file names, row positions, hex) live in the views: in
Spark (`reconciler.audit.engines.spark_joins`), ``row_rank`` is computed by the task that reads
the file, ``sha_prefix`` with ``conv``, and the ids are the strings themselves (``key``,
the raw key, the normalized ETag: Spark's joins and aggregates spill strings).

Spark runs the same text through `for_spark` (its string literals treat a backslash as an
escape, DuckDB's do not); no statement needs a Spark variant.

Only portable SQL: ``min``/``max``, ``bool_and``/``bool_or``, ``regexp_extract``,
``trim(BOTH ... FROM ...)``, ``||``, ``substr``, integer ``%``, ``CASE``, no ``FILTER``,
no ``QUALIFY``, no dialect's division, and no aggregate whose state is a string over
more than a few rows (they do not spill in DuckDB). Parameters (``{name}`` in the text)
are integers, put in by `bind`.

The results (each small unless the store is being migrated, when every record is
missing once):

- `RECORD_JOIN`: listed records to read (not cataloged; the newest row's normalized ETag
  differs; the key's rows disagree: two hours or two hashes; a key that is not
  well-formed) and cataloged keys never listed whose newest row's hour ended before the
  phantom limit (phantom candidates), with the newest row's values for the act phase;
- `BLOB_JOIN`: listed raw objects (frame blobs and bundles) referenced by no live row and
  older than the orphan limit (orphans, flagged ``raw_retention`` when only retired rows
  reference them), and referenced raw keys not listed and referenced by no retired row
  (missing-blob candidates; `REFERENCED` says which retired rows count);
- `reconciler.audit.engines.sql_bundles`: ranges past their bundle's listed size
  (``bad-range``) and each listed bundle's dead bytes.
"""

from __future__ import annotations

from protocol import keys

HOUR_NS = 3600 * 1_000_000_000


def normalized_etag(column: str) -> str:
    """`store.etag_check.normalized_etag` in SQL: a ``W/`` prefix and surrounding quotes
    removed (null stays null); plain string functions, no regular expression (it runs on
    every listed and cataloged ETag)."""
    unweak = f"CASE WHEN substr({column}, 1, 2) = 'W/' THEN substr({column}, 3) ELSE {column} END"
    return f"trim(BOTH '\"' FROM {unweak})"


def listed_modified_ns(kind: str, modified_ns: str) -> str:
    """The ``listing`` view's ``last_modified_ns`` in both engines, from ``modified_ns`` (the
    part's ``last_modified`` in nanoseconds) and ``kind`` (SQL expressions): a record
    without a LastModified (an S3 Inventory report may lack the column) counts as old,
    0: the report shows the bucket as of its creation, the audit's start (PROTOCOL §3.9:
    "the same in both"; a comparison with null would drop the record). A raw object's
    stays null: never old enough to be an orphan."""
    return (
        f"CASE WHEN {kind} IN ('raw-blobs', 'raw-bundles') THEN {modified_ns} "
        f"ELSE coalesce({modified_ns}, 0) END"
    )


def frame_blob_key(sha: str) -> str:
    """`protocol.keys.raw_blob_key` of the hash ``sha`` (an SQL expression), in SQL."""
    return (
        f"'{keys.RAW_BLOBS_PREFIX}' || substr({sha}, 1, 2) || '/' || substr({sha}, 3, 2) "
        f"|| '/' || {sha} || '{keys.RAW_BLOB_SUFFIX}'"
    )


def row_raw_key(raw_blob_key: str, frame_sha256: str) -> str:
    """The raw object a row names (SQL): its ``raw_blob_key`` (every well-formed row has
    one: a bundle's, or the frame blob of its hash), else the frame blob of its hash."""
    return f"coalesce({raw_blob_key}, {frame_blob_key(frame_sha256)})"


def bind(sql: str, **params: int) -> str:
    """``sql`` with each ``{name}`` replaced by the integer ``params[name]``."""
    for name, value in params.items():
        sql = sql.replace("{" + name + "}", str(int(value)))
    return sql


def for_spark(sql: str) -> str:
    """``sql`` for Spark SQL: every backslash doubled. Backslashes appear only inside
    string literals here (the regular expressions), which DuckDB reads verbatim and Spark
    unescapes (``'\\.'`` would become ``'.'``, any character)."""
    return sql.replace("\\", "\\\\")


def _hour(column: str) -> str:
    return f"({column} - {column} % {HOUR_NS})"


ACCEPTED_KEY_RE = r"^accepted/v1/agent=[^/]+/boot=[0-9a-f]{32}/[0-9]{20}-[0-9]{20}\.json$"
QUARANTINE_KEY_RE = (
    r"^quarantine/v1/identity-conflict/agent=[^/]+/boot=[0-9a-f]{32}/"
    r"[0-9]{20}-[0-9]{20}/[0-9a-f]{64}\.json$"
)
"""The shape of a well-formed record key (`protocol.keys`); a key that does not match is
read all the same (the cataloger records what it is), but is reported as ``junk``."""

PER_KEY = f"""
SELECT max_by(row_rank, write_rank) AS row_rank,
       (min({_hour("time_unix_ns")}) <> max({_hour("time_unix_ns")})
        OR min(sha_prefix) <> max(sha_prefix)
        OR min(raw_id) <> max(raw_id)
        OR min(coalesce(raw_offset, -1)) <> max(coalesce(raw_offset, -1))
        OR min(coalesce(raw_length, -1)) <> max(coalesce(raw_length, -1))) AS conflict,
       min(write_rank) <> max(write_rank) AS repeated,
       max_by(CASE WHEN kind = 'retracted' THEN 1 ELSE 0 END, write_rank) AS retracted
FROM catalog_rows
GROUP BY key_id
"""
"""Per cataloged key: the ``row_rank`` of the row that counts (the highest
``write_rank``; a tie is one row held by a merged file and its input, either will do),
whether the key has rows of more than one rank (``repeated``: the first audit after the
rank columns came reads those back, `JoinLimits.reread_repeated`), whether the row that
counts is ``retracted`` (PROTOCOL §3.7: the key counts as not cataloged, and is no
phantom), and whether its rows disagree (two
hours, or two hashes: compared by ``sha_prefix``, a 60-bit prefix of ``frame_sha256`` the
engine's view computes, so every aggregate state is fixed-size and spills; a false equal
has a chance of 2^-60 a key; or two raw keys, by ``raw_id``, or two ranges: PROTOCOL
§3.7, rows of one key that differ in raw key or range disagree). Grouped by ``key_id``, a fixed-size 128-bit digest of
``key`` the view computes (as the catalog's ``key_digest``): DuckDB's aggregate did not
spill 50M string keys under 512 MB, nor 10M under 100 MB. Kept as the table ``per_key``."""

NEWEST = """
SELECT r.key_id AS key_id, r.etag_id AS etag_id, r.time_unix_ns AS time_unix_ns,
       r.row_rank AS row_rank, p.conflict AS conflict, p.repeated AS repeated,
       p.retracted AS retracted
FROM catalog_rows r JOIN per_key p ON r.row_rank = p.row_rank
"""
"""The newest row of each key (``row_rank`` is unique: one row a key, even if a file
holds a key twice), fixed-size columns only (``key_id``; ``etag_id``, the view's 64-bit
hash of the normalized ETag): what the comparison needs of it, kept as the table
``newest``; the key, ETag and hashes of the few rows found are fetched after by
``row_rank`` (`RECORD_JOIN`). Each stage is its own statement, so each has the whole
memory limit (a pipeline of an aggregate and two joins over 50M keys ran out of 512 MB;
so did a join that carried the key and ETag strings)."""

RECORD_CANDIDATES = f"""
WITH listed AS (
  SELECT kind, key, key_id, etag, etag_id, last_modified_ns FROM listing
  WHERE kind = 'accepted' OR kind = 'quarantine'
),
joined AS (
  SELECT l.key AS key,
         l.kind AS kind,
         l.etag AS listed_etag,
         l.key_id IS NOT NULL AS listed,
         n.key_id IS NOT NULL AND coalesce(n.retracted, 0) = 0 AS cataloged,
         coalesce(n.retracted, 0) = 1 AS retracted,
         l.last_modified_ns AS last_modified_ns,
         l.etag_id AS listed_etag_id,
         n.etag_id AS etag_id,
         n.time_unix_ns AS time_unix_ns,
         n.row_rank AS row_rank,
         coalesce(n.conflict, false) AS conflict,
         coalesce(n.repeated, false) AND {{reread_repeated}} = 1 AS reread
  FROM listed l FULL OUTER JOIN newest n ON l.key_id = n.key_id
)
SELECT key, kind, listed_etag, listed, cataloged, last_modified_ns, time_unix_ns, row_rank,
       conflict, reread
FROM joined
WHERE (NOT listed AND NOT retracted
       AND {_hour("time_unix_ns")} + {HOUR_NS} <= {{phantom_before_ns}})
   OR (listed AND last_modified_ns <= {{born_before_ns}} AND (
         NOT cataloged OR conflict OR reread
         OR (listed_etag_id IS NOT NULL AND etag_id IS NOT NULL
             AND listed_etag_id <> etag_id)))
"""
"""The record join's rows (see `RECORD_JOIN`), to be kept as the table
``record_candidates`` (few rows, unless the store is being migrated). Joined on
``key_id`` (the views' 128-bit digest of ``key``, as the catalog's ``key_digest``): a
false equal has a chance of about 2^-128 a pair; ETags compared by ``etag_id`` (a
64-bit hash of the normalized ETag: a changed ETag taken for equal, ~2^-64 a key, is
a record not re-read by this audit)."""

RECORD_JOIN = f"""
SELECT coalesce(f.key, c.key) AS key, f.kind AS kind, f.listed_etag AS listed_etag,
       f.last_modified_ns AS last_modified_ns, {normalized_etag("c.etag")} AS etag,
       c.frame_sha256 AS frame_sha256, c.accepted_frame_sha256 AS accepted_frame_sha256,
       c.raw_blob_key AS raw_blob_key, c.raw_offset AS raw_offset, c.raw_length AS raw_length,
       f.time_unix_ns AS time_unix_ns, f.conflict AS conflict,
       CASE WHEN NOT f.listed THEN 'phantom'
            WHEN NOT f.cataloged AND f.kind = 'accepted'
                 AND regexp_extract(f.key, '{ACCEPTED_KEY_RE}', 0) = '' THEN 'junk'
            WHEN NOT f.cataloged AND f.kind = 'quarantine'
                 AND regexp_extract(f.key, '{QUARANTINE_KEY_RE}', 0) = '' THEN 'junk'
            WHEN NOT f.cataloged THEN 'missing'
            WHEN f.conflict THEN 'conflict'
            WHEN f.reread THEN 'rank'
            ELSE 'etag' END AS reason
FROM record_candidates f
LEFT JOIN (
  SELECT row_rank, key, etag, frame_sha256, accepted_frame_sha256, raw_blob_key, raw_offset,
         raw_length
  FROM catalog_rows
) c ON f.row_rank = c.row_rank
"""
"""``reason``: ``phantom`` (cataloged, never listed, hour ended before
``phantom_before_ns``), ``junk`` (listed key not well-formed: never cataloged, so only
keys not cataloged are matched against the shapes), ``missing`` (not cataloged),
``conflict`` (rows in two hours, with two hashes, two raw keys or two ranges), ``rank`` (rows of more than one
rank, in the first audit after the rank columns came: a merge written before them may
have made a stale row outrank a superseding one, so the store decides), ``etag`` (the
newest row's ETag, normalized, differs from the listed one; a row without an ETag takes
the listed one). Listed records last modified after ``born_before_ns`` (the audit's start plus
the settle margin) are the steady pass's and are left out; they still count as listed."""

LISTED_COUNTS = """
SELECT kind,
       sum(CASE WHEN kind IN ('raw-blobs', 'raw-bundles') OR last_modified_ns <= {born_before_ns}
                THEN 1 ELSE 0 END) AS old,
       sum(CASE WHEN kind NOT IN ('raw-blobs', 'raw-bundles')
                     AND last_modified_ns > {born_before_ns}
                THEN 1 ELSE 0 END) AS young
FROM listing
GROUP BY kind
"""
"""Keys listed per kind: the old ones (audited) and the young ones (the steady pass's)."""


def listed_raw(kind: str, prefix: str, suffix: str) -> str:
    """Listed keys of ``kind`` that are canonical raw object keys (`protocol.keys`): any
    other key under the prefix is skipped (as it always was); compared as a string
    before the one regular expression."""
    start = len(prefix + "hh/hh/") + 1
    return f"""
SELECT key, raw_id, size, last_modified_ns FROM (
  SELECT substr(key, {start}, 64) AS sha, key, raw_id, size, last_modified_ns
  FROM listing WHERE kind = '{kind}'
) b
WHERE key = '{prefix}' || substr(sha, 1, 2) || '/' || substr(sha, 3, 2) || '/' || sha || '{suffix}'
  AND regexp_extract(sha, '^[0-9a-f]{{64}}$', 0) <> ''
"""


BUNDLES = listed_raw("raw-bundles", keys.RAW_BUNDLES_PREFIX, keys.RAW_BUNDLE_SUFFIX)
_RAW_OBJECTS = (
    f"SELECT * FROM ({listed_raw('raw-blobs', keys.RAW_BLOBS_PREFIX, keys.RAW_BLOB_SUFFIX)}) rb "
    f"UNION ALL SELECT * FROM ({BUNDLES}) rn"
)
"""Listed raw objects, frame blobs and bundles (``raw_id``: the listing view's 128-bit
digest of the key)."""

REFERENCED = """
SELECT raw_id, bool_and(retired) AS retired_only, bool_or(retired) AS any_retired FROM (
  SELECT raw_id, retired FROM catalog_rows
  UNION ALL
  SELECT accepted_raw_id AS raw_id, false AS retired FROM catalog_rows
  WHERE accepted_raw_id IS NOT NULL
  UNION ALL
  SELECT raw_id, false AS retired FROM added_rows
  UNION ALL
  SELECT accepted_raw_id AS raw_id, false AS retired FROM added_rows
  WHERE accepted_raw_id IS NOT NULL
  UNION ALL
  SELECT q.accepted_raw_id AS raw_id, true AS retired
  FROM (SELECT DISTINCT accepted_frame_sha256, accepted_raw_id FROM (
    SELECT accepted_frame_sha256, accepted_raw_id FROM catalog_rows UNION ALL
    SELECT accepted_frame_sha256, accepted_raw_id FROM added_rows
  ) s WHERE accepted_raw_id IS NOT NULL) q JOIN catalog_rows a ON a.frame_sha256 = q.accepted_frame_sha256
  WHERE a.retired AND a.raw_offset IS NOT NULL
) r
GROUP BY raw_id
"""
"""Per referenced raw object (by ``raw_id``, the views' 128-bit digest of its key:
fixed-size, so the aggregate spills): whether only retired rows reference it, and
whether any does (a bundle is retired only when every row naming it is: PROTOCOL §3.10,
deleted only whole). Kept as the table ``referenced`` (a stage of its own, as `NEWEST`).
The view ``added_rows`` holds the rows the audit wrote after the record join (records it
cataloged or superseded): live references too.

A quarantine row's accepted side (the frame blob of ``accepted_frame_sha256``) counts as
retired too when its frame's accepted row is retired and names a bundle: raw retention may
have deleted the bundle before the conflict, the copy (§3.10) never made; its bytes were
retired, not lost (§4.1), as for a frame blob. Found by ``frame_sha256`` (frame and identity,
§1); orphans unchanged (the quarantine row is live); a frame never retired stays missing."""

BLOBS_LISTED = f"SELECT count(*) FROM ({_RAW_OBJECTS}) b"
"""Listed keys under ``raw-blobs/v1/`` and ``raw-bundles/v1/`` that name a raw object
(others are skipped, as always)."""

LISTED_BLOBS = f"SELECT raw_id, size, last_modified_ns FROM ({_RAW_OBJECTS}) b"
"""The listed raw objects' fixed-size columns (no key string), kept as the table
``listed_blobs``: the stage before `BLOB_JOIN`, with the whole memory limit to itself."""

BLOB_JOIN = """
SELECT coalesce(b.raw_id, r.raw_id) AS raw_id,
       b.size AS size,
       b.last_modified_ns AS last_modified_ns,
       coalesce(r.retired_only, false) AS raw_retention,
       CASE WHEN b.raw_id IS NULL THEN 'missing' ELSE 'orphan' END AS reason
FROM listed_blobs b FULL OUTER JOIN referenced r ON b.raw_id = r.raw_id
WHERE (b.raw_id IS NOT NULL AND (r.raw_id IS NULL OR r.retired_only)
       AND b.last_modified_ns < {orphan_before_ns})
   OR (b.raw_id IS NULL AND NOT r.any_retired)
"""
"""``orphan``: listed, referenced by no live row, last modified before ``orphan_before_ns``
(store time minus the retry horizon); ``raw_retention`` when retired rows alone reference
it. ``missing``: referenced, not listed, referenced by no retired row (a raw object raw
retention may have deleted is never missing). Fixed-size columns only, joined on
``raw_id`` (a join that carried every listed blob's 64-character hash ran out of 512 MB
at 50M manifests in DuckDB); the keys of the rows found are fetched after:
`ORPHAN_HASHES` from the listing, `REFERENCING_KEYS` from the catalog. Kept as the table
``blob_results`` (small unless orphans abound)."""

ORPHAN_HASHES = f"""
SELECT o.raw_id AS raw_id, min(b.key) AS raw_key
FROM (SELECT raw_id FROM blob_results WHERE reason = 'orphan') o
JOIN ({_RAW_OBJECTS}) b ON b.raw_id = o.raw_id
GROUP BY o.raw_id
"""
"""Each orphan's key, from the listing (kept as the table ``orphan_hashes``)."""

_ROW_RAW_KEY = row_raw_key("raw_blob_key", "frame_sha256")
REFERENCING_KEYS = f"""
SELECT m.raw_id AS raw_id, min(r.raw_key) AS raw_key, min(r.key) AS record_key
FROM (SELECT raw_id FROM blob_results WHERE reason = 'missing') m JOIN (
  SELECT key, {_ROW_RAW_KEY} AS raw_key, raw_id FROM catalog_rows
  UNION ALL
  SELECT key, {frame_blob_key("accepted_frame_sha256")} AS raw_key, accepted_raw_id AS raw_id
  FROM catalog_rows WHERE accepted_raw_id IS NOT NULL
  UNION ALL
  SELECT key, {_ROW_RAW_KEY} AS raw_key, raw_id FROM added_rows
  UNION ALL
  SELECT key, {frame_blob_key("accepted_frame_sha256")} AS raw_key, accepted_raw_id AS raw_id
  FROM added_rows WHERE accepted_raw_id IS NOT NULL
) r ON r.raw_id = m.raw_id
GROUP BY m.raw_id
"""
"""Each missing-blob candidate's raw key and a record that references it (kept as the
table ``referencing``)."""

_BLOB_HASH = (
    f"CASE WHEN substr(k.raw_key, 1, {len(keys.RAW_BLOBS_PREFIX)}) = '{keys.RAW_BLOBS_PREFIX}' "
    f"THEN substr(k.raw_key, {len(keys.RAW_BLOBS_PREFIX) + 7}, 64) "
    f"ELSE substr(k.raw_key, {len(keys.RAW_BUNDLES_PREFIX) + 7}, 64) END"
)
BLOB_RESULTS = f"""
SELECT k.raw_key AS raw_key, {_BLOB_HASH} AS frame_sha256, k.size AS size,
       k.last_modified_ns AS last_modified_ns, k.raw_retention AS raw_retention,
       k.reason AS reason
FROM (
  SELECT coalesce(o.raw_key, r.raw_key) AS raw_key, b.size AS size,
         b.last_modified_ns AS last_modified_ns, b.raw_retention AS raw_retention,
         b.reason AS reason
  FROM blob_results b
  LEFT JOIN orphan_hashes o ON b.raw_id = o.raw_id
  LEFT JOIN referencing r ON b.raw_id = r.raw_id
) k
"""
"""The blob join's rows with their raw keys (``blobs.parquet``): ``frame_sha256`` is the
hash in the key (a bundle's own for a bundle: what the GC's marks are named by)."""

RETIRED_HOUR_BATCHES = """
SELECT hour_start_ns, count(DISTINCT key) AS batches
FROM catalog_rows_of_covered_hours
WHERE kind = 'accepted'
GROUP BY hour_start_ns
"""
"""Per hour raw retention covers: its unique accepted batches (`Retired.holds`; the view
``catalog_rows_of_covered_hours`` is ``catalog_rows`` of those hours' files, with the
file's ``hour_start_ns``)."""

IS_REFERENCED = f"""
SELECT count(*) FROM catalog_rows
WHERE NOT retired AND ({_ROW_RAW_KEY} = ? OR {frame_blob_key("accepted_frame_sha256")} = ?)
"""
"""Whether a live row references a raw key (blob verification's message; rare)."""
