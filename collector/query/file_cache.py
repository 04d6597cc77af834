"""Snapshot files cached within ``query.cache_bytes`` (PROTOCOL §5 "Cost and scale": the
collector may cache files and footers), shared by the remote read, the names endpoints
and the series index lookups on one query collector.

Rollup data files are immutable (a new file gets a new uuid key; vacuum deletes, never
rewrites), so an entry keyed by the file's store key never goes stale and needs no
validation request. Kept, least recently used first out:

- ``footer``: a ``points`` file's Parquet footer (`pyarrow.parquet.FileMetaData`), charged
  twice its serialized size (the decoded objects are larger than the bytes);
- ``row_group``: one decoded row group of given columns (its Arrow size), or only its
  rows a read selects (`CachedParquet.read_selected`: the rows of the stored series and
  metrics a query wants, with their row numbers; keyed by that selection): the hot rows
  of the series a dashboard reads again and again, not the whole row groups around
  them (a 30-day read of 10 series out of 1,000 keeps 1% of each hourly file);
- ``file``: a whole small file decoded (the ``series``/``series_day`` index files, read
  whole by every lookup);
- ``series_rows``: the names endpoints' combined index rows of a set of index files
  (`collector.promql.names`: a names answer over an unchanged snapshot reads nothing).

An entry larger than an eighth of the bound is not kept (one scan of a huge file must
not flush everything else); with ``max_bytes = 0`` nothing is kept. A file whose footer
and row groups are all cached is not even opened: a repeated read makes no store request
for it. Hits and misses go to ``on_lookup(kind, hit)`` (the collector's metrics).
Thread-safe: selections run on worker threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from collector.metrics import CollectorMetrics
from rollup.table import schemas
from rollup.table.data_file import DataFile

FOOTER_CHARGE = 2
ENTRY_SHARE = 8


class FileCache:
    def __init__(
        self, max_bytes: int, *, on_lookup: Callable[[str, bool], None] | None = None
    ) -> None:
        self.max_bytes = max(0, max_bytes)
        self.max_entry_bytes = self.max_bytes // ENTRY_SHARE
        self._on_lookup = on_lookup or (lambda kind, hit: None)
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """Bytes charged now (never above ``max_bytes``)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, kind: str, key: Hashable) -> Any | None:
        with self._lock:
            found = self._entries.get((kind, key))
            if found is not None:
                self._entries.move_to_end((kind, key))
        self._on_lookup(kind, found is not None)
        return None if found is None else found[0]

    def put(self, kind: str, key: Hashable, value: Any, nbytes: int) -> None:
        if nbytes > self.max_entry_bytes:
            return
        with self._lock:
            old = self._entries.pop((kind, key), None)
            if old is not None:
                self._bytes -= old[1]
            self._entries[(kind, key)] = (value, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes and self._entries:
                _key, (_value, size) = self._entries.popitem(last=False)
                self._bytes -= size

    def parquet(
        self,
        filesystem: pafs.FileSystem,
        root: str,
        data_file: DataFile,
        *,
        read_dictionary: Sequence[str] | None = None,
    ) -> CachedParquet:
        """A ``points`` file read through the cache (use as a context manager)."""
        return CachedParquet(self, filesystem, f"{root}/{data_file.path}", read_dictionary)

    def read_whole(
        self,
        filesystem: pafs.FileSystem,
        root: str,
        data_file: DataFile,
        columns: Sequence[str],
        *,
        keep: bool = True,
    ) -> pa.Table:
        """A whole file's ``columns``, cast to its table's schema (an index file);
        ``keep=False``: not kept (a reader that caches what it makes of the files)."""
        key = (data_file.path, tuple(columns))
        found = self.get("file", key) if keep else None
        if found is not None:
            result: pa.Table = found
            return result
        schema = schemas.table_schema(data_file.table)
        target = pa.schema([schema.field(name) for name in columns])
        # One open (pq.read_table's dataset opens a file twice: to inspect, to read).
        with filesystem.open_input_file(f"{root}/{data_file.path}") as handle:
            table = pq.ParquetFile(handle).read(columns=list(columns))
        table = table.select(list(columns)).cast(target)
        if keep:
            self.put("file", key, table, table.nbytes)
        return table


def reads_cache(max_bytes: int, metrics: CollectorMetrics) -> FileCache:
    """A cache of ``max_bytes`` (``query.cache_bytes``) counting into ``metrics``."""
    return FileCache(max_bytes, on_lookup=metrics.observe_query_cache)


class _Footer:
    """A cached footer and what readers derived from it (``memo``)."""

    __slots__ = ("memo", "metadata")

    def __init__(self, metadata: pq.FileMetaData, memo: dict[Hashable, Any]) -> None:
        self.metadata = metadata
        self.memo = memo


class CachedParquet:
    """One Parquet file whose footer and row groups come from the cache when they can;
    the file is opened (one request on S3, then one per read) only on a miss."""

    def __init__(
        self,
        cache: FileCache,
        filesystem: pafs.FileSystem,
        path: str,
        read_dictionary: Sequence[str] | None,
    ) -> None:
        self._cache = cache
        self._filesystem = filesystem
        self._path = path
        self._read_dictionary = tuple(read_dictionary) if read_dictionary else None
        self._handle: Any = None
        self._file: pq.ParquetFile | None = None
        self._metadata: pq.FileMetaData | None = None
        self._footer_entry: _Footer | None = None
        self._closed = False

    def __enter__(self) -> CachedParquet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file; a read after this (a part's label maps read later) opens it
        again and closes it once read."""
        self._closed = True
        if self._handle is not None:
            self._handle.close()
            self._handle = None
            self._file = None

    def _open(self) -> pq.ParquetFile:
        if self._file is None:
            self._handle = self._filesystem.open_input_file(self._path)
            self._file = pq.ParquetFile(
                self._handle,
                metadata=self._metadata,
                read_dictionary=list(self._read_dictionary) if self._read_dictionary else None,
            )
        return self._file

    @property
    def metadata(self) -> pq.FileMetaData:
        return self._footer().metadata

    @property
    def memo(self) -> dict[Hashable, Any]:
        """Facts derived from the footer (e.g. parsed statistics), kept with it."""
        return self._footer().memo

    def _footer(self) -> _Footer:
        if self._footer_entry is None:
            found = self._cache.get("footer", self._path)
            if found is None:
                metadata = self._open().metadata
                found = _Footer(metadata, {})
                charge = FOOTER_CHARGE * metadata.serialized_size
                self._cache.put("footer", self._path, found, charge)
            self._footer_entry = found
            self._metadata = found.metadata
        return self._footer_entry

    def read_row_group(self, index: int, columns: Sequence[str]) -> pa.Table:
        key = (self._path, index, tuple(columns), self._read_dictionary)
        found = self._cache.get("row_group", key)
        if found is not None:
            result: pa.Table = found
            return result
        self.metadata  # noqa: B018 - the footer first, so that an open reuses it
        table = self._open().read_row_group(index, columns=list(columns))
        if self._closed:
            self.close()
        self._cache.put("row_group", key, table, table.nbytes)
        return table

    def read_selected(
        self,
        index: int,
        columns: Sequence[str],
        selection: Hashable,
        select: Callable[[pa.Table], np.ndarray | None],
    ) -> tuple[pa.Table, np.ndarray | None]:
        """The rows of row group ``index`` that ``select`` keeps (a mask, None: all), and
        their row numbers in the group (None: all rows), cached under ``selection`` (which
        must name what ``select`` keeps): a warm read decodes nothing, and the cache holds
        only the rows reads want."""
        key = (self._path, index, tuple(columns), self._read_dictionary, selection)
        found = self._cache.get("row_group", key)
        if found is not None:
            result: tuple[pa.Table, np.ndarray | None] = found
            return result
        self.metadata  # noqa: B018 - the footer first, so that an open reuses it
        table = self._open().read_row_group(index, columns=list(columns))
        mask = select(table)
        positions = None
        if mask is not None and not mask.all():
            positions = np.flatnonzero(mask)
            table = table.take(pa.array(positions))
        nbytes = table.nbytes + (positions.nbytes if positions is not None else 0)
        self._cache.put("row_group", key, (table, positions), nbytes)
        return table, positions
