"""Column-wise checks of index rows (PROTOCOL §3.7): which rows are well-formed.

The steady pass checks every row of every log segment; doing that with one Python object
per row capped one reconciler at a few hundred batches a second. These checks run on
Arrow columns: the Python-level work is per column, plus one small step per *distinct*
agent_id (its two key spellings), never per row. `well_formed` answers a boolean mask;
`first_problems` describes a few bad rows (with `index.rows.check_row`'s words) for
problem records and logs; `decode` reads one index file as validated rows.

A row is well-formed when:
- ``kind`` is ``accepted``, ``quarantine``, ``blob`` or (catalog files only: a log
  segment's are refused by `log_rows_well_formed`) ``retracted``; ``key``, ``frame_sha256`` and
  ``time_unix_ns`` are present; ``frame_sha256`` is 64 lowercase hex digits;
- a ``blob`` row's key is the raw object key of its hash: a frame blob's, or a bundle's
  (PROTOCOL §3.10: a bundle write's row names the bundle and its hash);
- an ``accepted``/``quarantine`` row's identity (agent_id, canonical boot_id UUID,
  seq_end >= seq_start) is the one its key names, in either agent form (``agent=<hex>`` or
  ``agent=h-<sha256>``, PROTOCOL §3), and a quarantine key ends in the submitted hash; a
  quarantine row also has a valid ``accepted_frame_sha256``;
- its raw key (PROTOCOL §3.7, §3.10): an ``accepted`` row names either the frame blob of
  its ``frame_sha256`` with no range (``raw_offset``/``raw_length`` null), or a canonical
  bundle key (`protocol.keys.raw_bundle_key`) with ``raw_offset >= 0`` and
  ``raw_length = frame_bytes`` a frame's length (`index.rows.FRAME_LENGTHS`); a ``quarantine``
  row names the frame blob of its submitted hash with no range (its accepted side is
  always the frame blob of ``accepted_frame_sha256``: the row holds no other key);
- a ``retracted`` row is well-formed as the ``accepted`` or ``quarantine`` row it copies
  (by its key's prefix).

Two parts of §3.10's rule are not a row's to check. That the range is one of the
bundle's index entries needs the bundle: a reader checks it when it reads the frame
(`protocol.bundle.read_frame`, `check_ranged_frame`; else a ``bad-range`` problem), and
the audit checks the range against the listed size. And ``raw_length <=
ingest.max_frame_bytes`` is each reader's bound before it reads (`protocol.bundle.
check_range`), not well-formedness: a record is kept for ever, and a setting lowered
later must not make stored records malformed (which would stop the GC for good, PROTOCOL
§3.5 rule 5); here the bound is the largest ``max_frame_bytes`` any setting allows.
"""

from __future__ import annotations

import hashlib
import re

import pyarrow as pa
import pyarrow.compute as pc

from protocol import keys

from .rows import FRAME_LENGTHS, IndexFileError, IndexRow, check_row, read_table, rows_of

_SHA_RE = "^[0-9a-f]{64}$"
_UUID_RE = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_ZERO_UUID = "00000000-0000-0000-0000-000000000000"
_RAW_KEY_RE = "^raw-(blobs|bundles)/v1/sha256/[0-9a-f]{2}/[0-9a-f]{2}/([0-9a-f]{64})[.]lmb[a-z]+$"
_BUNDLE_KEY_RE = (
    "^"
    + keys.RAW_BUNDLES_PREFIX
    + "[0-9a-f]{2}/[0-9a-f]{2}/[0-9a-f]{64}"
    + re.escape(keys.RAW_BUNDLE_SUFFIX)
    + "$"
)


def _true(mask: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Nulls (from null inputs) count as false."""
    return pc.fill_null(mask, False)


def _raw_object_keys(
    sha: pa.ChunkedArray | pa.Array, prefix: str, suffix: str
) -> pa.ChunkedArray | pa.Array:
    """``<prefix><hh>/<hh>/<sha><suffix>`` for each hash: the raw object key forms of
    `protocol.keys` (``raw_blob_key``, ``raw_bundle_key``), column-wise."""
    return pc.binary_join_element_wise(
        prefix,
        pc.utf8_slice_codeunits(sha, 0, 2),
        "/",
        pc.utf8_slice_codeunits(sha, 2, 4),
        "/",
        sha,
        suffix,
        "",
    )


def raw_blob_keys(sha: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """The raw-blob key of each hash (`protocol.keys.raw_blob_key`, column-wise)."""
    return _raw_object_keys(sha, keys.RAW_BLOBS_PREFIX, keys.RAW_BLOB_SUFFIX)


def _bundle_keys(sha: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """The bundle key of each hash (`protocol.keys.raw_bundle_key`, column-wise)."""
    return _raw_object_keys(sha, keys.RAW_BUNDLES_PREFIX, keys.RAW_BUNDLE_SUFFIX)


def raw_object_hashes(table: pa.Table) -> pa.ChunkedArray | pa.Array:
    """Per record row, the hash of the raw object it names: the hash part of its
    ``raw_blob_key`` (a frame blob's or a bundle's), ``frame_sha256`` where it has none."""
    named = pc.replace_substring_regex(
        table.column("raw_blob_key"), _RAW_KEY_RE, r"\2", max_replacements=1
    )
    canonical = pc.match_substring_regex(table.column("raw_blob_key"), _RAW_KEY_RE)
    return pc.if_else(_true(canonical), named, table.column("frame_sha256"))


def _bundle_keys_ok(key: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """Where ``key`` is a canonical bundle key: its shape, and its ``hh/hh`` the first two
    bytes of its hash (`protocol.keys.parse_raw_object_key`, column-wise)."""
    start = len(keys.RAW_BUNDLES_PREFIX)
    digest = pc.utf8_slice_codeunits(key, start + 6, start + 10)
    folders = pc.binary_join_element_wise(
        pc.utf8_slice_codeunits(key, start, start + 2),
        pc.utf8_slice_codeunits(key, start + 3, start + 5),
        "",
    )
    return _true(pc.and_(pc.match_substring_regex(key, _BUNDLE_KEY_RE), pc.equal(digest, folders)))


def raw_keys_ok(table: pa.Table) -> tuple[pa.ChunkedArray | pa.Array, pa.ChunkedArray | pa.Array]:
    """Per row, whether its raw key and range are a well-formed frame blob reference (the
    frame blob of ``frame_sha256``, no range) and whether they are a well-formed bundle
    reference (a canonical bundle key, ``raw_offset >= 0``, ``raw_length = frame_bytes``
    within `index.rows.FRAME_LENGTHS`)."""
    raw_key = table.column("raw_blob_key")
    offset, length = table.column("raw_offset"), table.column("raw_length")
    no_range = pc.and_(pc.is_null(offset), pc.is_null(length))
    blob = _true(pc.and_(no_range, pc.equal(raw_key, raw_blob_keys(table.column("frame_sha256")))))
    low, high = FRAME_LENGTHS
    ranged = pc.and_(
        pc.and_(pc.greater_equal(offset, 0), pc.equal(length, table.column("frame_bytes"))),
        pc.and_(pc.greater_equal(length, low), pc.less_equal(length, high)),
    )
    bundle = _true(pc.and_(_bundle_keys_ok(raw_key), ranged))
    return blob, bundle


def _agent_segments(agent_id: pa.ChunkedArray) -> tuple[pa.Array, pa.Array]:
    """Per row, the two spellings of its agent's key segment: ``agent=<hex>`` and
    ``agent=h-<sha256>`` (one Python step per distinct agent_id)."""
    encoded = pc.dictionary_encode(agent_id.combine_chunks())
    agents = encoded.dictionary.to_pylist()
    long_forms = pa.array([keys.long_agent_segment(a) for a in agents], pa.string())
    digests = [hashlib.sha256(a.encode("utf-8")).hexdigest() for a in agents]
    short_forms = pa.array([f"agent={keys.AGENT_DIGEST_MARK}{d}" for d in digests], pa.string())
    return long_forms.take(encoded.indices), short_forms.take(encoded.indices)


def _identity_keys(table: pa.Table, segment: pa.Array) -> tuple[pa.Array, pa.Array]:
    """The accepted-manifest key and the quarantine key each row's identity names, with
    ``segment`` as the agent's segment."""
    boot_hex = pc.replace_substring(table.column("boot_id"), "-", "")
    start = pc.utf8_lpad(pc.cast(table.column("seq_start"), pa.string()), 20, "0")
    end = pc.utf8_lpad(pc.cast(table.column("seq_end"), pa.string()), 20, "0")
    tail = pc.binary_join_element_wise(segment, "/boot=", boot_hex, "/", start, "-", end, "")
    accepted = pc.binary_join_element_wise(keys.ACCEPTED_PREFIX, tail, ".json", "")
    quarantine = pc.binary_join_element_wise(
        keys.QUARANTINE_PREFIX, tail, "/", table.column("frame_sha256"), ".json", ""
    )
    return accepted, quarantine


def well_formed(table: pa.Table) -> pa.ChunkedArray | pa.Array:
    """A boolean mask over a `index.rows.FILE_SCHEMA` table: True where the row is
    well-formed (the module docstring's rules)."""
    if table.num_rows == 0:
        return pa.array([], pa.bool_())
    kind = table.column("kind")
    sha = table.column("frame_sha256")
    basics = _true(
        pc.and_(
            pc.and_(pc.is_valid(table.column("key")), pc.is_valid(table.column("time_unix_ns"))),
            pc.match_substring_regex(sha, _SHA_RE),
        )
    )
    blob_key = raw_blob_keys(sha)
    is_blob = _true(pc.equal(kind, "blob"))
    is_accepted = _true(pc.equal(kind, "accepted"))
    is_quarantine = _true(pc.equal(kind, "quarantine"))
    is_retracted = _true(pc.equal(kind, "retracted"))
    blob_ok = _true(
        pc.or_(
            pc.equal(table.column("key"), blob_key),
            pc.equal(table.column("key"), _bundle_keys(sha)),
        )
    )

    boot = table.column("boot_id")
    identity_ok = _true(
        pc.and_(
            pc.and_(
                pc.match_substring_regex(boot, _UUID_RE),
                pc.not_equal(boot, _ZERO_UUID),
            ),
            pc.greater_equal(table.column("seq_end"), table.column("seq_start")),
        )
    )
    long_form, short_form = _agent_segments(table.column("agent_id"))
    accepted_long, quarantine_long = _identity_keys(table, long_form)
    accepted_short, quarantine_short = _identity_keys(table, short_form)
    key = table.column("key")
    accepted_key_ok = _true(pc.or_(pc.equal(key, accepted_long), pc.equal(key, accepted_short)))
    quarantine_key_ok = _true(
        pc.and_(
            pc.or_(pc.equal(key, quarantine_long), pc.equal(key, quarantine_short)),
            pc.match_substring_regex(table.column("accepted_frame_sha256"), _SHA_RE),
        )
    )
    names_blob, names_bundle = raw_keys_ok(table)
    record_ok = pc.and_(
        identity_ok,
        pc.or_(
            pc.and_(
                pc.and_(pc.or_(is_accepted, is_retracted), accepted_key_ok),
                pc.or_(names_blob, names_bundle),
            ),
            pc.and_(pc.and_(pc.or_(is_quarantine, is_retracted), quarantine_key_ok), names_blob),
        ),
    )
    return pc.and_(basics, pc.or_(pc.and_(is_blob, blob_ok), record_ok))


def log_rows_well_formed(table: pa.Table) -> pa.ChunkedArray | pa.Array:
    """`well_formed` for a log segment's rows: a ``retracted`` row is the lease holder's,
    never a collector's claim."""
    if table.num_rows == 0:
        return pa.array([], pa.bool_())
    return pc.and_(well_formed(table), _true(pc.not_equal(table.column("kind"), "retracted")))


def first_problems(table: pa.Table, mask: pa.ChunkedArray | pa.Array, limit: int = 10) -> list[str]:
    """Words for up to ``limit`` rows the mask refused (`index.rows.check_row`'s)."""
    bad = table.filter(pc.invert(mask)).slice(0, limit)
    problems = []
    for row in rows_of(bad):
        problems.append(_describe(row))
    return problems


def _describe(row: IndexRow) -> str:
    try:
        check_row(row, source="row")
    except ValueError as exc:
        return str(exc)
    return f"{row.kind!r} row {row.key!r}: identity does not match its key"


def decode(body: bytes, *, source: str) -> list[IndexRow]:
    """Every row of one index file, validated column-wise (`well_formed`);
    `IndexFileError` naming ``source`` and the first bad row else."""
    table = read_table(body, source=source)
    mask = well_formed(table)
    if not pc.all(mask).as_py() and table.num_rows:
        raise IndexFileError(f"{source}: {first_problems(table, mask, 1)[0]}")
    return rows_of(table)
