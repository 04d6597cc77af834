"""Which catalog row of a key counts (PROTOCOL §3.7): the one definition, rendered for
Arrow, DuckDB and Spark.

For a key, the row written last counts. Every row carries its **rank**: the (epoch,
sequence) of the catalog file it was *first* written in and its position there
(`RANK_COLUMNS`, compared in that order). A merge keeps its inputs' ranks, so merging
never makes an old row newer than a superseding row written after it: ranking by the
merged file's own name did (a merged file takes a new, higher sequence, and the stale
row it carried then outranked the newer row it had not merged).

A row whose rank columns are null takes its own file's (epoch, sequence) — from the
file's name, ``<epoch:010d>-<sequence:010d>.parquet`` — and its position in that file.
That is every row a steady pass, an audit or a retraction writes (they are first written
there), and every row of a file written before these columns existed (a merged file of
then ranks as the file it is; PROTOCOL §3.7: the first audit after the upgrade reads back
every key that has more than one row, `reconciler.audit.run`). Rows are filled in by
`with_rank` wherever a file is read for ranking: local copies for DuckDB
(`index.catalog_local.write_normalized`: merges, hour totals, the rollup planner, the
audit), Arrow hours (`index.catalog_tables`), the Spark audit's file tasks and the chaos
auditor. Merged files are written from filled copies, so their rows keep their ranks.

Renderings of the order:
- Arrow: `newest_per_key` (a sort by key, then rank descending);
- DuckDB: `duckdb_write_rank` (one fixed-size ``HUGEINT``, for ``max_by``/``arg_max``:
  every DuckDB reader's aggregate states must stay fixed-size to spill, and a ``max``
  over a struct holding a string stays in memory above the limit);
- Spark: `spark_write_rank` (a ``DECIMAL(38,0)`` of the same value).

The packed value is ``epoch << 66 | sequence << 32 | position``: sequences are below
10^10 < 2^34 (`index.catalog.CatalogWriter` counts them modulo 10^10) and positions below
2^32 (`MAX_POSITION`; a file holds far fewer rows), so the packing orders as the tuple.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from protocol import keys

RANK_COLUMNS = ("first_epoch", "first_sequence", "first_position")
RANK_FIELDS = [pa.field(name, pa.int64()) for name in RANK_COLUMNS]
SEQUENCE_BITS = 34
POSITION_BITS = 32
MAX_POSITION = (1 << POSITION_BITS) - 1


def file_rank(catalog_key: str) -> tuple[int, int]:
    """``(epoch, sequence)`` of a catalog file, from its name."""
    _hour, epoch, sequence = keys.parse_index_catalog_key(catalog_key)
    return epoch, sequence


def with_rank(table: pa.Table, catalog_key: str, *, first_position: int = 0) -> pa.Table:
    """``table`` (rows of the catalog file ``catalog_key``, from its row
    ``first_position`` on, in file order) with every rank column present and filled:
    a null rank is the file's own (epoch, sequence) and the row's position in it."""
    epoch, sequence = file_rank(catalog_key)
    rows = table.num_rows
    if first_position + rows - 1 > MAX_POSITION:
        raise ValueError(f"{catalog_key}: more than {MAX_POSITION + 1} rows")
    own = {
        "first_epoch": pa.repeat(pa.scalar(epoch, pa.int64()), rows),
        "first_sequence": pa.repeat(pa.scalar(sequence, pa.int64()), rows),
        "first_position": pa.array(range(first_position, first_position + rows), pa.int64()),
    }
    # A row's rank is all three columns or none (a merge copies all three).
    unranked = (
        pc.is_null(table.column("first_epoch")) if "first_epoch" in table.column_names else None
    )
    for name in RANK_COLUMNS:
        if name in table.column_names and unranked is not None:
            index = table.column_names.index(name)
            column = table.column(name).cast(pa.int64())
            table = table.set_column(index, name, pc.if_else(unranked, own[name], column))
        else:
            table = table.append_column(pa.field(name, pa.int64()), own[name])
    return table


def is_ranked(table: pa.Table) -> bool:
    """Whether every row of ``table`` carries its rank (a merged file of this version)."""
    return all(
        name in table.column_names and table.column(name).null_count == 0 for name in RANK_COLUMNS
    )


def newest_per_key(table: pa.Table) -> pa.Table:
    """The rows of ``table`` (every rank column filled, `with_rank`), one per key: the
    highest rank's, sorted by key. Ties (one row held by a merged file and by its input
    not yet deleted) are copies of one row: either is taken."""
    if table.num_rows == 0:
        return table
    order = pc.sort_indices(
        table,
        [("key", "ascending")] + [(name, "descending") for name in RANK_COLUMNS],
    )
    ranked = table.take(order)
    key = ranked.column("key").combine_chunks()
    if len(key) == 1:
        return ranked
    first = pc.not_equal(key.slice(1), key.slice(0, len(key) - 1))
    mask = pa.concat_arrays([pa.array([True]), first.cast(pa.bool_())])
    return ranked.filter(mask)


def duckdb_write_rank(prefix: str = "") -> str:
    """A row's rank as one ``HUGEINT`` in DuckDB (``prefix``: the table alias and a dot)."""
    return (
        f"(({prefix}first_epoch::HUGEINT << {SEQUENCE_BITS + POSITION_BITS}) "
        f"+ ({prefix}first_sequence::HUGEINT << {POSITION_BITS}) "
        f"+ {prefix}first_position::HUGEINT)"
    )


def spark_write_rank(prefix: str = "") -> str:
    """A row's rank as one ``DECIMAL(38,0)`` in Spark SQL (the same value as
    `duckdb_write_rank`; ``prefix``: the table alias and a dot)."""
    high = 1 << (SEQUENCE_BITS + POSITION_BITS)
    low = 1 << POSITION_BITS
    return (
        f"(CAST({prefix}first_epoch AS DECIMAL(38,0)) * CAST({high} AS DECIMAL(38,0)) "
        f"+ CAST({prefix}first_sequence AS DECIMAL(38,0)) * CAST({low} AS DECIMAL(38,0)) "
        f"+ CAST({prefix}first_position AS DECIMAL(38,0)))"
    )


def packed_rank(epoch: int, sequence: int, position: int) -> int:
    """The packed value of a rank in Python (tests, and the few rows that need one)."""
    return (epoch << (SEQUENCE_BITS + POSITION_BITS)) | (sequence << POSITION_BITS) | position
