"""Store backends for the shared contract suite.

Every backend is a `Backend` in `STORE_BACKENDS`, keyed by the name that appears in test
ids (``test_x[fs]``). To add one (an S3 server, say), write an async context manager
factory that takes the pytest request (for session fixtures such as a running server)
and yields a fresh, empty store, then register it:

    STORE_BACKENDS["ministack"] = Backend(_ministack_store, marks=(pytest.mark.s3,))
    STORE_BACKENDS["moto"] = Backend(_moto_store, atomic_conditions=False, marks=(...))

Fixtures:

- ``store``: one fresh store per test, parametrized over every backend.
- ``concurrent_store``: the same, over only the backends whose conditional writes are
  atomic under contention (moto checks then writes without a lock, so two racing writers
  can both win there). Races between writers use this one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from store.base import ObjectStore
from store.fs import FileSystemStore
from store.memory import MemoryStore
from store.s3 import MIN_PART_BYTES, S3Store
from store.timed import TimedStore
from tests.s3_servers import RunningServer, fresh_bucket

StoreFactory = Callable[[pytest.FixtureRequest], AbstractAsyncContextManager[ObjectStore]]


@dataclass(frozen=True)
class Backend:
    """How to make a fresh store of one kind, and what it can be trusted with."""

    make: StoreFactory
    # False where racing conditional writes may both succeed: excluded from race tests.
    atomic_conditions: bool = True
    marks: tuple[pytest.MarkDecorator, ...] = field(default=())


@asynccontextmanager
async def _memory_store(request: pytest.FixtureRequest) -> AsyncIterator[ObjectStore]:
    store = MemoryStore()
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def _fs_store(request: pytest.FixtureRequest) -> AsyncIterator[ObjectStore]:
    tmp_path: Path = request.getfixturevalue("tmp_path")
    store = FileSystemStore(tmp_path / "store")
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def _timed_store(request: pytest.FixtureRequest) -> AsyncIterator[ObjectStore]:
    """The daemons' latency wrapper (`store.timed`) must keep every promise of the store
    (over the memory store: the contract's cost, not its coverage, grows with the disk)."""
    async with _memory_store(request) as inner:
        yield TimedStore(inner, observe=lambda _op, _result, _seconds: None)


def _s3_store(server_fixture: str) -> StoreFactory:
    """A store under a prefix in a fresh bucket on the session's server of that kind."""

    @asynccontextmanager
    async def make(request: pytest.FixtureRequest) -> AsyncIterator[ObjectStore]:
        server: RunningServer = request.getfixturevalue(server_fixture)
        store = S3Store(
            bucket=fresh_bucket(server),
            prefix="contract",
            endpoint_url=server.endpoint_url,
            connect_timeout_s=2.0,
            read_timeout_s=30.0,
            upload_part_bytes=MIN_PART_BYTES,  # put_file's tests span parts at 11 MiB
        )
        try:
            yield store
        finally:
            await store.close()

    return make


STORE_BACKENDS: dict[str, Backend] = {
    "memory": Backend(_memory_store),
    "fs": Backend(_fs_store),
    "timed": Backend(_timed_store),
    "ministack": Backend(_s3_store("ministack_server"), marks=(pytest.mark.s3,)),
    # moto checks conditions then writes without a lock: no race tests there.
    "moto": Backend(_s3_store("moto_server"), atomic_conditions=False, marks=(pytest.mark.s3,)),
}


def _params(*, atomic_only: bool) -> list[object]:
    return [
        pytest.param(name, marks=backend.marks, id=name)
        for name, backend in STORE_BACKENDS.items()
        if backend.atomic_conditions or not atomic_only
    ]


@pytest.fixture(params=_params(atomic_only=False))
def store_backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(params=_params(atomic_only=True))
def concurrent_store_backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
async def store(store_backend: str, request: pytest.FixtureRequest) -> AsyncIterator[ObjectStore]:
    async with STORE_BACKENDS[store_backend].make(request) as made:
        yield made


@pytest.fixture
async def concurrent_store(
    concurrent_store_backend: str, request: pytest.FixtureRequest
) -> AsyncIterator[ObjectStore]:
    async with STORE_BACKENDS[concurrent_store_backend].make(request) as made:
        yield made
