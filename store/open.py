"""`open_store(url, **options)`: one entry point from a store URL to an `ObjectStore`.

- ``memory://NAME``: in-process (tests, simulations); the same NAME in one process is the
  same store.
- ``file://PATH``: the embedded filesystem store (PATH absolute, or relative to the
  working directory).
- ``s3://BUCKET[/PREFIX]``: S3 or an S3-compatible server (``endpoint_url``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from protocol.clock import Clock

from .base import ObjectStore
from .errors import StoreConfigError
from .fs import FileSystemStore
from .memory import MemoryStore

_MEMORY_STORES: dict[str, MemoryStore] = {}


class StoreOptions(Protocol):
    """The ``[store]`` settings `open_store_from_settings` reads (see `config.StoreSettings`)."""

    @property
    def url(self) -> str: ...
    @property
    def endpoint_url(self) -> str | None: ...
    @property
    def region(self) -> str: ...
    @property
    def max_pool_connections(self) -> int: ...
    @property
    def connect_timeout_s(self) -> float: ...
    @property
    def read_timeout_s(self) -> float: ...
    @property
    def max_clock_skew_s(self) -> float: ...


def open_store(url: str, *, clock: Clock | None = None, **s3_options: Any) -> ObjectStore:
    """Open the store at ``url``; ``s3_options`` go to `store.s3.S3Store` for ``s3://``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise StoreConfigError(f"store url {url!r} has no scheme: use file://, s3:// or memory://")
    if scheme == "memory":
        if rest not in _MEMORY_STORES:
            _MEMORY_STORES[rest] = MemoryStore(url, clock=clock)
        return _MEMORY_STORES[rest]
    if scheme == "file":
        if not rest:
            raise StoreConfigError(f"store url {url!r} names no directory")
        return FileSystemStore(Path(rest).absolute(), clock=clock)
    if scheme == "s3":
        from .s3 import S3Store  # only s3:// needs aiobotocore loaded

        return S3Store.from_url(url, clock=clock, **s3_options)
    raise StoreConfigError(
        f"store url {url!r}: unknown scheme {scheme!r} (use file://, s3:// or memory://)"
    )


def open_store_from_settings(settings: StoreOptions, *, clock: Clock | None = None) -> ObjectStore:
    return open_store(
        settings.url,
        clock=clock,
        endpoint_url=settings.endpoint_url,
        region=settings.region,
        max_pool_connections=settings.max_pool_connections,
        connect_timeout_s=settings.connect_timeout_s,
        read_timeout_s=settings.read_timeout_s,
        max_clock_skew_s=settings.max_clock_skew_s,
    )
