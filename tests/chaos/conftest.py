"""Chaos test helpers: an `S3Store` that talks to MiniStack through a `FaultProxy`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from chaos.proxy import FaultProxy
from store.retry import Backoff
from store.s3 import S3Store
from tests.s3_servers import TEST_CREDENTIALS, RunningServer

PREFIX = "chaos-test"


@dataclass
class Proxied:
    proxy: FaultProxy
    store: S3Store
    direct: S3Store


def s3_store(bucket: str, endpoint_url: str, *, read_timeout_s: float = 3.0) -> S3Store:
    """One attempt per call (no retries that would hide a fault), short timeouts."""
    return S3Store(
        bucket=bucket,
        prefix=PREFIX,
        endpoint_url=endpoint_url,
        connect_timeout_s=1.0,
        read_timeout_s=read_timeout_s,
        credentials=TEST_CREDENTIALS,
        backoff=Backoff(attempts=1),
    )


@pytest.fixture
async def proxied(ministack_server: RunningServer, ministack_bucket: str) -> AsyncIterator[Proxied]:
    proxy = FaultProxy(
        upstream=ministack_server.endpoint_url,
        seed=7,
        bucket=ministack_bucket,
        prefix=PREFIX,
        max_hold_s=5.0,
        late_extra_s=0.2,
    )
    await proxy.start()
    store = s3_store(ministack_bucket, proxy.url)
    direct = s3_store(ministack_bucket, ministack_server.endpoint_url, read_timeout_s=10.0)
    try:
        yield Proxied(proxy, store, direct)
    finally:
        await store.close()
        await direct.close()
        await proxy.stop()
