"""The live window's presented label sets, kept as batches are added (PROTOCOL §5 "Names").

Each batch the window holds is summarised once, column-wise, into its distinct stored
series with their first and last point time and their presented name and labels
(`protocol.prom_names`); a names request then filters those small tables by time instead
of touching points. Summaries live exactly as long as their batch is in the window (one
per held batch: bounded by the window), so memory follows the window's own bounds.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from protocol.prom_names import escape_metric_array, presented_labels_array
from rollup.table.columns import int64_column
from rollup.table.points import series_of

from ..query.window import WindowBatch

LABEL_SETS_SCHEMA = pa.schema(
    [
        ("series", pa.string()),
        ("presented_name", pa.string()),
        ("presented_labels", pa.map_(pa.string(), pa.string())),
        ("first_ns", pa.int64()),
        ("last_ns", pa.int64()),
    ]
)
"""One row per stored series: what a names answer needs, times in unix nanoseconds."""


def summarise(batch: WindowBatch) -> pa.Table:
    """The distinct stored series of one batch (`LABEL_SETS_SCHEMA`)."""
    points = batch.frame.points
    if points.num_rows == 0:
        return LABEL_SETS_SCHEMA.empty_table()
    metric = points.column("metric").combine_chunks()
    labels = points.column("labels").combine_chunks()
    series = series_of(metric, labels)
    ts = int64_column(points.column("ts"))
    encoded = pc.dictionary_encode(series)
    codes = np.asarray(encoded.indices.to_numpy())
    distinct = len(encoded.dictionary)
    first = np.full(distinct, np.iinfo(np.int64).max, np.int64)
    last = np.full(distinct, np.iinfo(np.int64).min, np.int64)
    np.minimum.at(first, codes, ts)
    np.maximum.at(last, codes, ts)
    _, one_row = np.unique(codes, return_index=True)
    picked = pa.array(one_row)
    presented, _dropped = presented_labels_array(labels.take(picked))
    return pa.Table.from_arrays(
        [
            encoded.dictionary,
            escape_metric_array(metric.take(picked).cast(pa.string())),
            presented,
            pa.array(first),
            pa.array(last),
        ],
        schema=LABEL_SETS_SCHEMA,
    )


class LiveLabelSets:
    """Summaries of the window's batches by ``manifest_id``, made when first asked for."""

    def __init__(self) -> None:
        self._summaries: dict[str, pa.Table] = {}

    def in_range(self, batches: Iterable[WindowBatch], start_ns: int, end_ns: int) -> pa.Table:
        """Stored series of ``batches`` with a point in ``[start_ns, end_ns]``; summaries
        of batches no longer given are forgotten."""
        held: dict[str, pa.Table] = {}
        for batch in batches:
            summary = self._summaries.get(batch.manifest_id)
            if summary is None:
                summary = summarise(batch)
            held[batch.manifest_id] = summary
        self._summaries = held
        if not held:
            return LABEL_SETS_SCHEMA.empty_table()
        table = pa.concat_tables(held.values())
        overlaps = pc.and_(
            pc.less_equal(table.column("first_ns"), end_ns),
            pc.greater_equal(table.column("last_ns"), start_ns),
        )
        return table.filter(overlaps)
