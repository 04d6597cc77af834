"""A catalog hour as Python row objects (`read_hour`): for the simulation, tests and the
benchmarks' baseline only.

PROTOCOL §3.9 forbids one Python object per row for a catalog hour in the product: an
hour at 1k batches/s is 3.6M rows, ~5.5 GiB as `IndexRow` objects (bench/RESULTS.md,
`bench.catalog_hour`). The product reads hours with `index.catalog_tables` (Arrow, or
DuckDB out of core). This is the reader it replaced, kept in one place for what is small
by construction (the simulation's worlds, tests) and for the benchmarks that measure the
old way; `tests/index/test_catalog_rows_scope.py` keeps it out of the product.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from index.catalog_tables import read_hour_table
from index.rows import IndexRow, rows_of
from protocol import keys
from store.base import ObjectInfo, ObjectStore


@dataclass
class CatalogHour:
    hour: keys.UtcHour
    rows: dict[str, IndexRow] = field(default_factory=dict)
    files: list[ObjectInfo] = field(default_factory=list)

    def accepted(self) -> list[IndexRow]:
        return [row for row in self.rows.values() if row.kind == "accepted"]

    def batches(self) -> list[IndexRow]:
        """The hour's accepted *batches*, in key order: one row per ``manifest_id``. A
        batch cataloged under both agent key forms (PROTOCOL §3: the long form a
        collector of before the segment rule wrote and the ``h-`` form, in a
        mixed-version upgrade) is one batch: its row with the least key counts (the long
        form, ``agent=<hex>`` sorting before ``agent=h-``), as `index.catalog_tables`
        counts an hour's batches for the product."""
        chosen: dict[str, IndexRow] = {}
        for row in sorted(self.accepted(), key=lambda r: r.key):
            chosen.setdefault(row.manifest_id, row)
        return list(chosen.values())


async def read_hour(store: ObjectStore, hour: keys.UtcHour) -> CatalogHour:
    """The hour's catalog: every file's rows, a key counted once: the row that counts
    (PROTOCOL §3.7, the product's one definition: `index.catalog_tables.read_hour_table`,
    `index.catalog_rank`), as objects."""
    read = await read_hour_table(store, hour)
    return CatalogHour(hour, {row.key: row for row in rows_of(read.table)}, files=list(read.files))
