"""The store as a `pyarrow.fs` filesystem, for Parquet I/O on the driver and the executors.

The async `store.ObjectStore` is the seam for records (manifests, leases, pointers); bulk
Parquet is read and written through pyarrow instead, by Spark executors that cannot share
the driver's event loop. `StoreAccess` is the small, picklable description an executor
gets; `arrow_filesystem` turns a store URL into ``(filesystem, root)``, where object ``K``
is the file ``f"{root}/{K}"`` of that filesystem.

- ``file://PATH`` → `pyarrow.fs.LocalFileSystem`, root ``PATH``.
- ``s3://BUCKET[/PREFIX]`` → `pyarrow.fs.S3FileSystem` (credentials from the standard AWS
  chain; ``endpoint_url`` for S3-compatible servers, plain HTTP when it says ``http://``),
  root ``BUCKET[/PREFIX]``.
- ``memory://`` cannot be shared with other processes: `StoreConfigError`.

Writes are not conditional: every Parquet file gets a fresh UUID name, is referenced only
once a snapshot naming it is committed, and is otherwise an orphan that vacuum deletes.

Requests per object (cost): `read_object` on S3 is one GET through a botocore client
(pyarrow's S3 input streams HEAD every object for its size first, which doubled the
rollup's GET-class requests per batch); pyarrow's S3 filesystem is opened with
``allow_delayed_open``, so an output stream smaller than one part is written with a single
PUT instead of a multipart upload's three requests.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from config.store_url import FileLocation, S3Location, parse_store_url
from store.errors import StoreConfigError

if TYPE_CHECKING:
    from config.settings import StoreSettings


@dataclass(frozen=True, slots=True)
class StoreAccess:
    """How an executor reaches the store: the ``[store]`` settings it needs, picklable."""

    url: str
    endpoint_url: str | None = None
    region: str = "us-east-1"

    @classmethod
    def of(cls, store: StoreSettings) -> StoreAccess:
        """The access the ``[store]`` settings describe."""
        return cls(store.url, endpoint_url=store.endpoint_url, region=store.region)

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """``(filesystem, root)``; cached per process, so a Python worker that runs many
        tasks builds its S3 client once."""
        return _cached_filesystem(self.url, self.endpoint_url, self.region)


def arrow_filesystem(
    store_url: str, *, endpoint_url: str | None = None, region: str = "us-east-1"
) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, root)`` for ``store_url``: object ``K`` is ``f"{root}/{K}"``.

    Raises `StoreConfigError` for ``memory://`` (not reachable from other processes) or a
    URL that does not parse."""
    try:
        location = parse_store_url(store_url)
    except ValueError as exc:
        raise StoreConfigError(f"store url {store_url!r}: {exc}") from None
    if isinstance(location, FileLocation):
        return pafs.LocalFileSystem(), str(location.path)
    if isinstance(location, S3Location):
        options: dict[str, object] = {"region": region, "allow_delayed_open": True}
        if endpoint_url is not None:
            parts = urlsplit(endpoint_url)
            options["endpoint_override"] = parts.netloc
            options["scheme"] = parts.scheme or "https"
        root = f"{location.bucket}/{location.prefix}" if location.prefix else location.bucket
        return pafs.S3FileSystem(**options), root
    raise StoreConfigError(
        f"store url {store_url!r}: the rollup needs a store other processes can reach "
        "(file:// or s3://), not memory://"
    )


@functools.lru_cache(maxsize=8)
def _cached_filesystem(
    url: str, endpoint_url: str | None, region: str
) -> tuple[pafs.FileSystem, str]:
    return arrow_filesystem(url, endpoint_url=endpoint_url, region=region)


def engine_url(store_url: str, key: str) -> str:
    """Where another engine (DuckDB, Spark, Iceberg readers) finds object ``key``: an
    absolute path on a ``file://`` store, ``s3://BUCKET/PREFIX/KEY`` on S3."""
    location = parse_store_url(store_url)
    if isinstance(location, FileLocation):
        return str(location.path / key)
    if isinstance(location, S3Location):
        prefix = f"{location.prefix}/" if location.prefix else ""
        return f"s3://{location.bucket}/{prefix}{key}"
    raise StoreConfigError(f"store url {store_url!r}: other processes cannot read memory://")


def object_path(root: str, key: str) -> str:
    """The filesystem path of object ``key``."""
    return f"{root}/{key}"


def read_object(access: StoreAccess, key: str) -> bytes:
    """The whole body of ``key``. Raises `FileNotFoundError` when it does not exist and
    `OSError` for other failures (retries are the S3 client's, bounded and jittered:
    a GET is safe to repeat)."""
    location = parse_store_url(access.url)
    if isinstance(location, S3Location):
        client = _s3_client(access.endpoint_url, access.region)
        object_key = f"{location.prefix}/{key}" if location.prefix else key
        try:
            answer = client.get_object(Bucket=location.bucket, Key=object_key)
            return bytes(answer["Body"].read())
        except client.exceptions.NoSuchKey:
            raise FileNotFoundError(key) from None
        except Exception as exc:  # botocore's errors: one type for the caller
            raise OSError(f"GET {key}: {exc}") from exc
    fs, root = access.filesystem()
    with fs.open_input_stream(object_path(root, key)) as stream:
        return bytes(stream.readall())


def read_object_range(access: StoreAccess, key: str, offset: int, length: int) -> bytes:
    """Bytes ``[offset, offset + length)`` of ``key`` (fewer where it ends; none past its
    end): one GET with a Range on S3 (416 is no bytes), a bounded read of the file
    otherwise. Raises `FileNotFoundError` / `OSError` as `read_object`."""
    location = parse_store_url(access.url)
    if isinstance(location, S3Location):
        client = _s3_client(access.endpoint_url, access.region)
        object_key = f"{location.prefix}/{key}" if location.prefix else key
        wanted = f"bytes={offset}-{offset + length - 1}"
        try:
            answer = client.get_object(Bucket=location.bucket, Key=object_key, Range=wanted)
            body = bytes(answer["Body"].read())
        except client.exceptions.NoSuchKey:
            raise FileNotFoundError(key) from None
        except Exception as exc:  # botocore's errors: one type for the caller
            if _status(exc) == 416:
                return b""
            raise OSError(f"GET {key} {wanted}: {exc}") from exc
        # A server that ignored the Range sent the whole object: cut the range out.
        return body if answer.get("ContentRange") else body[offset : offset + length]
    fs, root = access.filesystem()
    with fs.open_input_file(object_path(root, key)) as file:
        size = file.size()
        return (
            bytes(file.read_at(max(0, min(length, size - offset)), offset))
            if offset < size
            else b""
        )


def object_size(access: StoreAccess, key: str) -> int:
    """The size of ``key`` (one HEAD on S3). Raises `FileNotFoundError` / `OSError`."""
    location = parse_store_url(access.url)
    if isinstance(location, S3Location):
        client = _s3_client(access.endpoint_url, access.region)
        object_key = f"{location.prefix}/{key}" if location.prefix else key
        try:
            return int(client.head_object(Bucket=location.bucket, Key=object_key)["ContentLength"])
        except Exception as exc:  # a HEAD's 404 has no NoSuchKey code
            if _status(exc) == 404:
                raise FileNotFoundError(key) from None
            raise OSError(f"HEAD {key}: {exc}") from exc
    fs, root = access.filesystem()
    info = fs.get_file_info(object_path(root, key))
    if info.type != pafs.FileType.File:
        raise FileNotFoundError(key)
    return int(info.size)


def _status(exc: Exception) -> int | None:
    status = getattr(exc, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


@functools.lru_cache(maxsize=8)
def _s3_client(endpoint_url: str | None, region: str) -> Any:
    """A botocore S3 client per process (standard retry mode: at most 3 attempts, jittered
    exponential backoff); credentials from the standard AWS chain, like pyarrow's."""
    import botocore.config
    import botocore.session

    config = botocore.config.Config(
        retries={"mode": "standard", "max_attempts": 3},
        max_pool_connections=16,
        s3={"addressing_style": "path" if endpoint_url else "auto"},  # as store.s3 does
    )
    return botocore.session.get_session().create_client(
        "s3", endpoint_url=endpoint_url, region_name=region, config=config
    )


def open_parquet_writer(
    access: StoreAccess,
    key: str,
    schema: pa.Schema,
    *,
    compression: str,
) -> tuple[pq.ParquetWriter, pa.NativeFile]:
    """A `ParquetWriter` streaming to ``key`` (parents created on a local filesystem).
    Close the writer, then the stream."""
    fs, root = access.filesystem()
    path = object_path(root, key)
    if isinstance(fs, pafs.LocalFileSystem):
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    stream = fs.open_output_stream(path)
    writer = pq.ParquetWriter(stream, schema, compression=compression)
    return writer, stream


def read_parquet(access: StoreAccess, keys: list[str], schema: pa.Schema) -> pa.Table:
    """Concatenated rows of the Parquet files ``keys`` (empty table of ``schema`` when
    none). Raises `FileNotFoundError` if one is missing."""
    if not keys:
        return schema.empty_table()
    fs, root = access.filesystem()
    tables = [pq.read_table(object_path(root, key), filesystem=fs, schema=schema) for key in keys]
    return pa.concat_tables(tables)
