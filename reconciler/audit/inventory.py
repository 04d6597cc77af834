"""S3 Inventory reports as an alternative to listing the bucket (audits, and the GC).

An inventory configuration delivers, per run, ``<config folder>/<YYYY-MM-DDTHH-MMZ>/
manifest.json`` naming data files (``files[].key``, keys in the destination bucket) in
``fileFormat`` ``CSV`` (gzip, no header, columns in ``fileSchema``, object keys
URL-encoded) or ``Parquet`` (columns ``bucket``, ``key``, ``size``,
``last_modified_date``, ...). ORC is not supported.

`InventorySource` reads one report: the manifest at ``location`` if it ends with
``manifest.json``, else the newest ``<timestamp>/manifest.json`` under the ``location``
folder. Keys are made relative to the acceptance store by removing ``source_prefix``
(the store's prefix in its bucket); rows outside it, old versions and delete markers
are skipped. Data files are read one at a time (each held in memory compressed and
decoded in batches in a thread), so memory stays bounded by the largest data file.

Locations (`InventorySource.from_url`): ``s3://BUCKET/PATH`` (data file keys are relative
to the bucket root), or ``file://DIR``, a directory laid out like the destination bucket
(data file keys relative to ``DIR``; the newest manifest anywhere under it is used).

Note for GC: an inventory lists the bucket as it was at ``creationTimestamp`` (the
manifest's; objects written shortly before may be missing), so an audit from an
inventory counts as having started then, not when it was read.
"""

from __future__ import annotations

import asyncio
import csv
import gzip
import io
import json
import re
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from config import S3Location, Settings
from store.base import ObjectStore
from store.errors import NotFound

_MANIFEST_RE = re.compile(r"(?:^|/)(\d{4}-\d{2}-\d{2}T\d{2}-\d{2}Z)/manifest\.json$")
_BATCH_ROWS = 5000


class InventoryError(ValueError):
    """The inventory report is missing, malformed, or of an unsupported format."""


@dataclass(frozen=True, slots=True)
class InventoryObject:
    key: str
    """Relative to the acceptance store (``source_prefix`` removed)."""
    size: int | None
    last_modified_ns: int | None
    etag: str | None = None
    """As the report gives it (the optional ``ETag`` field), else ``None``."""


@dataclass(frozen=True, slots=True)
class InventoryReport:
    manifest_key: str
    source_bucket: str
    file_format: str
    columns: tuple[str, ...]
    """CSV: the ``fileSchema`` column names, in order. Parquet: empty (read by name)."""
    created_at_unix_ns: int
    files: tuple[str, ...]


class InventorySource:
    def __init__(
        self,
        *,
        store: ObjectStore,
        location: str = "",
        source_prefix: str = "",
        source_bucket: str | None = None,
        owns_store: bool = False,
    ) -> None:
        self._store = store
        self._location = location
        self._source_prefix = source_prefix
        self._source_bucket = source_bucket
        self._owns_store = owns_store
        self._report: InventoryReport | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        source_prefix: str = "",
        source_bucket: str | None = None,
        endpoint_url: str | None = None,
        region: str = "us-east-1",
    ) -> InventorySource:
        """Open the inventory at ``s3://BUCKET/PATH`` or ``file://DIR`` (see the module doc).
        ``source_bucket``, when given, must match the report's ``sourceBucket``."""
        scheme, _, rest = url.partition("://")
        store: ObjectStore
        if scheme == "file":
            from store.fs import FileSystemStore

            store, location = FileSystemStore(Path(rest)), ""
        elif scheme == "s3":
            from store.s3 import S3Store

            bucket, _, location = rest.partition("/")
            store = S3Store(bucket=bucket, endpoint_url=endpoint_url, region=region)
            if location and not location.endswith("manifest.json"):
                location = location.rstrip("/") + "/"
        else:
            raise InventoryError(f"inventory url {url!r}: use s3://BUCKET/PATH or file://DIR")
        return cls(
            store=store,
            location=location,
            source_prefix=source_prefix,
            source_bucket=source_bucket,
            owns_store=True,
        )

    async def close(self) -> None:
        if self._owns_store:
            await self._store.close()

    async def report(self) -> InventoryReport:
        """The report's manifest (read once). Raises `InventoryError`."""
        if self._report is None:
            key = await self._manifest_key()
            try:
                body, _etag = await self._store.get(key)
            except NotFound:
                raise InventoryError(f"inventory manifest {key!r} does not exist") from None
            self._report = parse_manifest(key, body)
            if (
                self._source_bucket is not None
                and self._report.source_bucket != self._source_bucket
            ):
                raise InventoryError(
                    f"inventory {key!r} is of bucket {self._report.source_bucket!r}, "
                    f"not {self._source_bucket!r}"
                )
        return self._report

    async def objects(
        self, file_key: str, prefixes: tuple[str, ...], *, skip_rows: int = 0
    ) -> AsyncIterator[tuple[int, InventoryObject]]:
        """(row number, object) of every row of one data file, from row ``skip_rows`` on,
        whose key (relative to the acceptance store) starts with one of ``prefixes``."""
        report = await self.report()
        try:
            body, _etag = await self._store.get(file_key)
        except NotFound:
            raise InventoryError(f"inventory data file {file_key!r} does not exist") from None
        rows = _rows(body, report)
        index = 0
        while True:
            batch = await asyncio.to_thread(_take, rows, _BATCH_ROWS)
            if not batch:
                return
            for full_key, size, modified, etag in batch:
                row, index = index, index + 1
                if row < skip_rows or not full_key.startswith(self._source_prefix):
                    continue
                key = full_key[len(self._source_prefix) :]
                if key.startswith(prefixes):
                    yield row, InventoryObject(key, size, modified, etag)

    async def _manifest_key(self) -> str:
        if self._location.endswith("manifest.json"):
            return self._location
        newest: tuple[str, str] | None = None
        async for info in self._store.list(self._location):
            match = _MANIFEST_RE.search(info.key)
            if match and (newest is None or match.group(1) > newest[0]):
                newest = (match.group(1), info.key)
        if newest is None:
            raise InventoryError(f"no <timestamp>/manifest.json under {self._location!r}")
        return newest[1]


def parse_manifest(key: str, body: bytes) -> InventoryReport:
    """Parse an inventory ``manifest.json``. Raises `InventoryError`."""
    try:
        doc = json.loads(body)
        file_format = str(doc["fileFormat"])
        files = tuple(str(f["key"]) for f in doc["files"])
        source_bucket = str(doc["sourceBucket"])
        created_ms = int(doc["creationTimestamp"])
        schema = str(doc.get("fileSchema", ""))
    except (ValueError, KeyError, TypeError) as exc:
        raise InventoryError(f"inventory manifest {key!r} is malformed: {exc!r}") from None
    if file_format.upper() == "CSV":
        columns = tuple(c.strip() for c in schema.split(","))
        if "Key" not in columns:
            raise InventoryError(f"inventory {key!r}: fileSchema has no Key column: {schema!r}")
        file_format = "CSV"
    elif file_format.lower() == "parquet":
        columns, file_format = (), "Parquet"
    else:
        raise InventoryError(f"inventory {key!r}: fileFormat {file_format!r} is not CSV or Parquet")
    return InventoryReport(key, source_bucket, file_format, columns, created_ms * 1_000_000, files)


_Row = tuple[str, int | None, int | None, str | None]


def _take(rows: Iterator[_Row], count: int) -> list[_Row]:
    batch: list[_Row] = []
    for row in rows:
        batch.append(row)
        if len(batch) == count:
            break
    return batch


def _rows(body: bytes, report: InventoryReport) -> Iterator[_Row]:
    if report.file_format == "CSV":
        return _csv_rows(body, report.columns)
    return _parquet_rows(body)


def _csv_rows(body: bytes, columns: tuple[str, ...]) -> Iterator[_Row]:
    position = {name: i for i, name in enumerate(columns)}
    text = io.TextIOWrapper(gzip.GzipFile(fileobj=io.BytesIO(body)), encoding="utf-8", newline="")
    for record in csv.reader(text):
        if not record:
            continue
        if _field(record, position, "IsLatest") == "false":
            continue  # an older version: not what the bucket holds
        if _field(record, position, "IsDeleteMarker") == "true":
            continue
        # CSV inventories URL-encode keys (form encoding: '+' is a space).
        key = urllib.parse.unquote_plus(record[position["Key"]], encoding="utf-8", errors="strict")
        size = _field(record, position, "Size")
        modified = _field(record, position, "LastModifiedDate")
        yield (
            key,
            int(size) if size else None,
            _iso_to_ns(modified) if modified else None,
            _field(record, position, "ETag") or None,
        )


def _field(record: list[str], position: dict[str, int], name: str) -> str | None:
    index = position.get(name)
    if index is None or index >= len(record):
        return None
    return record[index].strip().lower() if name.startswith("Is") else record[index]


def _iso_to_ns(text: str) -> int:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(moment.timestamp() * 1000) * 1_000_000


def _parquet_rows(body: bytes) -> Iterator[_Row]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(io.BytesIO(body))
    names = set(parquet.schema_arrow.names)
    if "key" not in names:
        raise InventoryError("Parquet inventory file has no 'key' column")
    wanted = [
        c
        for c in ("key", "size", "last_modified_date", "e_tag", "is_latest", "is_delete_marker")
        if c in names
    ]
    for batch in parquet.iter_batches(batch_size=_BATCH_ROWS, columns=wanted):
        data: dict[str, list[Any]] = {name: batch.column(name).to_pylist() for name in wanted}
        for i, key in enumerate(data["key"]):
            if "is_latest" in data and data["is_latest"][i] is False:
                continue
            if "is_delete_marker" in data and data["is_delete_marker"][i] is True:
                continue
            size = data["size"][i] if "size" in data else None
            modified = data["last_modified_date"][i] if "last_modified_date" in data else None
            yield key, size, _to_ns(modified), data["e_tag"][i] if "e_tag" in data else None


def _to_ns(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:  # a timestamp column without a zone holds UTC
            value = value.replace(tzinfo=UTC)
        return int(value.timestamp() * 1000) * 1_000_000
    return int(value) * 1_000_000  # TIMESTAMP_MILLIS stored as a plain int64


def inventory_from_settings(settings: Settings, url: str | None = None) -> InventorySource | None:
    """The inventory at ``url``, else at ``reconciler.inventory_url``; None without one.
    Raises `InventoryError` for a location it cannot read."""
    url = url or settings.reconciler.inventory_url
    if url is None:
        return None
    location = settings.store.location
    prefix, bucket = "", None
    if isinstance(location, S3Location):
        prefix = f"{location.prefix}/" if location.prefix else ""
        bucket = location.bucket
    return InventorySource.from_url(
        url,
        source_prefix=prefix,
        source_bucket=bucket,
        endpoint_url=settings.store.endpoint_url,
        region=settings.store.region,
    )
