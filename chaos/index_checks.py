"""The index invariants chaos checks (PROTOCOL §3.7), for the simulation and the auditor.

`read_catalog` reads every catalog file of a settled store (no reconciler running), a key
counted once by the index's one rule (`index.catalog_rank`: the row written last), and
which files a rollup work marker names; `catalog_problems` compares it with the records
themselves. After a completed full audit:

- every accepted manifest and quarantine record is in the catalog, with its hash;
- no catalog row names a record that does not exist, or with another hash (catalog
  rows are verified: the reconciler read each record itself);
- every catalog file reads (an unreadable one blocks the GC and the rollup planner);
- every cataloged accepted batch is either in the rollup's committed ledger or in a
  catalog file that a work marker names, so no batch waits for an unrelated change to
  its hour before the rollup includes it.

`catalog_setsums` gives the per-hour totals of the catalog's accepted rows, which the
rollup's ledger must equal.

`read_frames` joins records to raw objects by raw key (PROTOCOL §3.10): a record names a
frame blob (read whole, hashed) or a bundle and its frame's range (the frame read through
`index.raw_reads`, which checks its CRC, hash and identity; a bundle is fetched once for
all the records naming it and its frames cut out of it; a frame its range does not hold
falls back to the bundle's index, `read_frame`). A quarantine record names frame blobs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from index.catalog import list_all_files
from index.catalog_rank import newest_per_key
from index.catalog_tables import read_file_table
from index.raw_reads import BadRange, RawRef, frame_in_span, read_frame
from index.rows import FRAME_LENGTHS, IndexFileError, IndexRow, rows_of
from protocol import keys, records
from protocol.setsum import Setsum
from store.base import ObjectStore
from store.errors import NotFound


@dataclass
class CatalogView:
    """Every catalog row by key (the union of the files, a key counted once: the row that
    counts, `index.catalog_rank`)."""

    rows: dict[str, IndexRow] = field(default_factory=dict)
    marked: set[str] = field(default_factory=set)
    """Keys of rows held by a file that a rollup work marker names."""
    files: int = 0
    unreadable: list[str] = field(default_factory=list)
    vanished: int = 0
    """Files listed but gone when read: only in a store still being compacted."""


async def read_catalog(store: ObjectStore) -> CatalogView:
    view = CatalogView()
    marked_files: set[str] = set()
    async for info in store.list(keys.ROLLUP_WORK_PREFIX):
        try:
            marked_files.add(keys.parse_rollup_work_marker_key(info.key))
        except keys.KeyFormatError:
            continue
    tables: list[pa.Table] = []
    async for info in list_all_files(store):
        view.files += 1
        try:
            table = await read_file_table(store, info.key)
        except NotFound:
            view.vanished += 1
            continue
        except IndexFileError as exc:
            view.unreadable.append(str(exc))
            continue
        tables.append(table)
        if info.key in marked_files:
            view.marked.update(table.column("key").to_pylist())
    if tables:
        view.rows = {row.key: row for row in rows_of(newest_per_key(pa.concat_tables(tables)))}
    return view


@dataclass(frozen=True, slots=True)
class RecordFacts:
    """What the store holds at a record key: its kind and the hash its row must carry
    (a manifest's ``frame_sha256``, a quarantine record's submitted hash)."""

    kind: str
    frame_sha256: str
    manifest_id: str | None = None
    raw: RawRef | None = None
    """The raw object and range the record names, when the caller checks them too: a row
    naming another raw object or range disagrees with its record (PROTOCOL §3.10)."""


def catalog_problems(
    view: CatalogView,
    records: Mapping[str, RecordFacts],
    *,
    rolled_up: Iterable[str] = (),
) -> list[str]:
    """Each broken invariant of the module doc, as a sentence. ``rolled_up``: the
    manifest ids the latest committed ledger includes (their markers may be consumed)."""
    problems = [f"unreadable catalog file: {text}" for text in view.unreadable]
    included = set(rolled_up)
    for key, facts in sorted(records.items()):
        row = view.rows.get(key)
        if row is None:
            problems.append(f"{facts.kind} record {key} is not in the catalog")
            continue
        if row.kind != facts.kind or row.frame_sha256 != facts.frame_sha256:
            problems.append(
                f"catalog row {key} says {row.kind} {row.frame_sha256[:16]}, the store holds "
                f"{facts.kind} {facts.frame_sha256[:16]}"
            )
        elif facts.raw is not None and (
            row.raw_blob_key != facts.raw.raw_key
            or (row.raw_offset, row.raw_length) != (facts.raw.raw_offset, facts.raw.raw_length)
        ):
            problems.append(
                f"catalog row {key} names {row.raw_blob_key} [{row.raw_offset}, "
                f"+{row.raw_length}), its record {named(facts.raw)}"
            )
        if (
            facts.kind == "accepted"
            and key not in view.marked
            and facts.manifest_id not in included
        ):
            problems.append(f"{key} is neither rolled up nor in a file a work marker names")
    for key in sorted(set(view.rows) - set(records)):
        problems.append(f"catalog row {key} names no record in the store")
    return problems


def catalog_setsums(view: CatalogView) -> dict[str, tuple[int, int, Setsum]]:
    """Per accepted hour: batches, records and setsum of the catalog's accepted rows."""
    totals: dict[str, tuple[int, int, Setsum]] = {}
    for row in view.rows.values():
        if row.kind != "accepted":
            continue
        batches, records, setsum = totals.get(row.hour.iso, (0, 0, Setsum()))
        totals[row.hour.iso] = (
            batches + 1,
            records + (row.record_count or 0),
            setsum.add(row.manifest_id, row.frame_sha256),
        )
    return totals


def submitted_ref(conflict: records.IdentityConflict) -> RawRef:
    """The frame blob a quarantine record names for its submitted frame."""
    return RawRef(conflict.submitted_raw_blob_key, conflict.submitted_frame_sha256)


async def read_frames(
    store: ObjectStore, refs: Iterable[RawRef], states: dict[RawRef, str | None]
) -> None:
    """Into ``states``, each of ``refs`` (all naming one raw object) -> None when the object
    holds its frame, else what is wrong ("missing", "hashing to ...", "bad-range: ...").
    One GET of the object, however many records name it."""
    refs = list(refs)
    try:
        body, _ = await store.get(refs[0].raw_key)
    except NotFound:
        states.update(dict.fromkeys(refs, "missing"))
        return
    for ref in refs:
        states[ref] = await _frame_state(store, ref, body)


async def _frame_state(store: ObjectStore, ref: RawRef, body: bytes) -> str | None:
    if not ref.ranged:  # a frame blob: the object whole is the frame
        stored = hashlib.sha256(body).hexdigest()
        return None if stored == ref.frame_sha256 else f"hashing to {stored[:16]}"
    if frame_in_span(ref, 0, body) is not None:
        return None
    try:  # the range does not hold the frame: the bundle's index may (PROTOCOL §3.10)
        frame = await read_frame(store, ref, max_frame_bytes=FRAME_LENGTHS[1])
    except NotFound:
        return "missing"
    return f"bad-range: {frame.detail}" if isinstance(frame, BadRange) else None


def named(ref: RawRef) -> str:
    where = "" if not ref.ranged else f" [{ref.raw_offset}, +{ref.raw_length})"
    return f"{ref.raw_key}{where} (frame {ref.frame_sha256[:16]})"
