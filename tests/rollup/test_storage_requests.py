"""The rollup's bulk I/O on S3 costs one request per object: a blob read is one GET (no
HEAD for its size first) and a small Parquet file one PUT (no multipart upload)."""

from __future__ import annotations

import asyncio

import pyarrow as pa
import pytest

from chaos.proxy import FaultProxy
from rollup.table.storage import StoreAccess, open_parquet_writer, read_object
from tests.s3_servers import RunningServer, fresh_bucket

pytestmark = pytest.mark.s3

SCHEMA = pa.schema([pa.field("value", pa.float64())])


def write_then_read(access: StoreAccess) -> tuple[bytes, pa.Table]:
    table = pa.table({"value": [1.0, 2.0, 3.0]}, schema=SCHEMA)
    writer, stream = open_parquet_writer(
        access, "rollup/v1/tables/t/x.parquet", SCHEMA, compression="zstd"
    )
    writer.write_table(table)
    writer.close()
    stream.close()
    return read_object(access, "rollup/v1/tables/t/x.parquet"), table


async def test_a_read_is_one_get_and_a_small_file_is_one_put(
    ministack_server: RunningServer,
) -> None:
    bucket = fresh_bucket(ministack_server)
    async with FaultProxy(
        upstream=ministack_server.endpoint_url, seed=0, bucket=bucket, prefix="lm"
    ) as proxy:
        access = StoreAccess(url=f"s3://{bucket}/lm", endpoint_url=proxy.url)
        body, table = await asyncio.to_thread(write_then_read, access)
        with pytest.raises(FileNotFoundError):
            await asyncio.to_thread(read_object, access, "raw-blobs/v1/sha256/00/00/none.lmbatch")

    assert body.startswith(b"PAR1") and body.endswith(b"PAR1")
    assert table.num_rows == 3
    assert dict(proxy.requests) == {"put": 1, "get": 2}  # the hit and the miss


async def test_a_ranged_read_and_a_size_are_one_request_each(
    ministack_server: RunningServer,
) -> None:
    """The executors' bundle reads (PROTOCOL §3.10): a range is one GET with a Range
    header, its bytes only; past the end none (416); a size one HEAD; absent raises."""
    from rollup.table.storage import object_size, read_object_range
    from store.s3 import S3Store

    bucket = fresh_bucket(ministack_server)
    body = bytes(range(256)) * 4
    setup = S3Store.from_url(f"s3://{bucket}/lm", endpoint_url=ministack_server.endpoint_url)
    await setup.put("raw-bundles/v1/b", body)
    await setup.close()
    async with FaultProxy(
        upstream=ministack_server.endpoint_url, seed=0, bucket=bucket, prefix="lm"
    ) as proxy:
        access = StoreAccess(url=f"s3://{bucket}/lm", endpoint_url=proxy.url)

        def reads() -> tuple[bytes, bytes, bytes, int]:
            return (
                read_object_range(access, "raw-bundles/v1/b", 100, 50),
                read_object_range(access, "raw-bundles/v1/b", 1000, 100),
                read_object_range(access, "raw-bundles/v1/b", 5000, 10),
                object_size(access, "raw-bundles/v1/b"),
            )

        inside, tail, past, size = await asyncio.to_thread(reads)
        with pytest.raises(FileNotFoundError):
            await asyncio.to_thread(object_size, access, "raw-bundles/v1/none")
        with pytest.raises(FileNotFoundError):
            await asyncio.to_thread(read_object_range, access, "raw-bundles/v1/none", 0, 10)

    assert (inside, tail, past, size) == (body[100:150], body[1000:], b"", len(body))
    assert dict(proxy.requests) == {"get": 4, "head": 2}
