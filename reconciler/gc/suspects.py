"""Orphan suspects from the index log's ``blob`` rows, held as Arrow columns.

A ``blob`` row says a collector created a raw blob. A blob whose hash no ``accepted`` or
``quarantine`` row has named yet is a GC candidate once it is older than the retry
horizon (the GC marks it; only the rule-5 audit and the targeted proof can clear it for
deletion, PROTOCOL §3.5). A suspect keeps the raw object key its row names, so a bundle
is marked under its bundle key (PROTOCOL §3.10) from its first candidacy. The steady
pass hands each chunk's ``blob`` rows and referenced hashes over as columns
(`add_blobs`, `add_references`): no Python object per row. Both sets are bounded
(``max_entries``): a restart or an overflow loses some suspects, and the audit's orphan
file finds those instead.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

MAX_SUSPECTS = 1_000_000
_SCHEMA = pa.schema([("sha", pa.string()), ("at_ns", pa.int64())])
_SUSPECTS_SCHEMA = _SCHEMA.append(pa.field("raw_key", pa.string()))
Suspect = tuple[str, int, str]
"""A suspect handed over: its raw object's hash, when its ``blob`` row says it was
created (unix ns), and the raw object key the row names (a frame blob's or a bundle's)."""


def _empty(schema: pa.Schema = _SCHEMA) -> pa.Table:
    return schema.empty_table()


class OrphanSuspects:
    """Blob hashes from ``blob`` rows that no record row has referenced yet (bounded)."""

    def __init__(self, max_entries: int = MAX_SUSPECTS) -> None:
        self._max = max_entries
        self._created = _empty(_SUSPECTS_SCHEMA)  # suspects: (sha, created, raw key)
        self._refs = _empty()  # hashes referenced within the lookback: (sha, seen)
        self.dropped = 0

    def __len__(self) -> int:
        return int(self._created.num_rows)

    def add_blobs(
        self,
        shas: pa.Array | pa.ChunkedArray,
        created_ns: pa.Array | pa.ChunkedArray,
        raw_keys: pa.Array | pa.ChunkedArray,
    ) -> None:
        """Blob rows (their hashes, times and keys): a hash not referenced lately and not
        suspected yet becomes a suspect."""
        new = pa.table(
            {"sha": shas, "at_ns": created_ns, "raw_key": raw_keys}, schema=_SUSPECTS_SCHEMA
        )
        known = pa.concat_arrays(
            [
                self._refs.column("sha").combine_chunks(),
                self._created.column("sha").combine_chunks(),
            ]
        )
        new = new.filter(pc.invert(pc.is_in(new.column("sha"), value_set=known)))
        # One raw key per hash (a frame blob and a bundle never share bytes): min picks it.
        new = (
            new.group_by("sha")
            .aggregate([("at_ns", "min"), ("raw_key", "min")])
            .rename_columns(["sha", "at_ns", "raw_key"])
        )
        room = max(0, self._max - self._created.num_rows)
        if new.num_rows > room:
            self.dropped += new.num_rows - room
            new = new.slice(0, room)
        if new.num_rows:
            self._created = pa.concat_tables(
                [self._created, new.cast(_SUSPECTS_SCHEMA)]
            ).combine_chunks()

    def add_references(
        self, shas: pa.Array | pa.ChunkedArray, at_ns: pa.Array | pa.ChunkedArray
    ) -> None:
        """Hashes named by record rows: no longer suspects, and remembered for the lookback
        so a late ``blob`` row of the same hash is not taken for an orphan."""
        if len(shas) == 0:
            return
        refs = pa.table({"sha": shas, "at_ns": at_ns}, schema=_SCHEMA)
        self._created = self._created.filter(
            pc.invert(pc.is_in(self._created.column("sha"), value_set=refs.column("sha")))
        )
        room = max(0, self._max - self._refs.num_rows)
        self._refs = pa.concat_tables([self._refs, refs.slice(0, room)]).combine_chunks()

    def forget_refs_before(self, horizon_ns: int) -> None:
        self._refs = self._refs.filter(pc.greater_equal(self._refs.column("at_ns"), horizon_ns))

    def recently_referenced(self, sha: str) -> bool:
        return bool(pc.any(pc.equal(self._refs.column("sha"), sha)).as_py())

    def take_older_than(self, horizon_ns: int) -> list[Suspect]:
        """Hand over (and forget) the suspects created before ``horizon_ns``: the GC's
        candidates, few by nature (a blob whose manifest never came)."""
        old = pc.less(self._created.column("at_ns"), horizon_ns)
        taken = self._created.filter(old).sort_by("sha")
        self._created = self._created.filter(pc.invert(old))
        columns = (taken.column(name).to_pylist() for name in ("sha", "at_ns", "raw_key"))
        return list(zip(*columns, strict=True))
