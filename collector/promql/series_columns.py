"""The samples of one remote-read query, column-wise (PROTOCOL §5): what the selection
(`collector.promql.select`) hands the encoders (`collector.promql.encode`).

Series are in Prometheus' label order (``labels.Compare`` over the presented label set,
names and values compared as bytes) and unique; series ``i`` owns the samples
``offsets[i]:offsets[i + 1]`` of ``timestamps_ms`` (strictly increasing within a series)
and ``values`` (float64, bit for bit as stored: staleness markers survive). There is no
Python object per sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

LabelSet = tuple[tuple[str, str], ...]
"""A presented label set, ``__name__`` included, sorted by name (byte order)."""


@dataclass(frozen=True, slots=True)
class SeriesColumns:
    label_sets: Sequence[LabelSet]
    offsets: npt.NDArray[np.int64]  # len(label_sets) + 1, offsets[0] == 0
    timestamps_ms: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]

    def __post_init__(self) -> None:
        if len(self.offsets) != len(self.label_sets) + 1 or (
            len(self.offsets) and self.offsets[0] != 0
        ):
            raise ValueError("offsets must start at 0 and have one entry per series plus one")
        if len(self.timestamps_ms) != len(self.values) or int(self.offsets[-1]) != len(self.values):
            raise ValueError("offsets, timestamps_ms and values disagree on the sample count")

    @property
    def sample_count(self) -> int:
        return len(self.values)

    @classmethod
    def empty(cls) -> SeriesColumns:
        return cls(
            label_sets=(),
            offsets=np.zeros(1, np.int64),
            timestamps_ms=np.zeros(0, np.int64),
            values=np.zeros(0, np.float64),
        )


def label_order_key(label_set: LabelSet) -> tuple[tuple[bytes, bytes], ...]:
    """Sort key equal to Prometheus' ``labels.Compare`` on sorted label sets: pair by
    pair, name then value as bytes; a set that is a prefix of another sorts first."""
    return tuple((name.encode(), value.encode()) for name, value in label_set)
