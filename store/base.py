"""The `ObjectStore` protocol: the one seam between Lightmetrics and its system of record.

Keys are relative to the store's root (a directory for ``file://``, ``bucket/prefix`` for
``s3://``); they are non-empty UTF-8 strings of ``/``-separated segments, none of them
empty, ``.`` or ``..``, and never start with ``/``.

Contract, shared by every implementation and checked by ``tests/store/test_contract.py``:

- ``get(key) -> (body, etag)``; `NotFound` when absent.
- ``head(key) -> ObjectInfo``; `NotFound` when absent.
- ``put(key, body, *, if_none_match=False, if_match=None) -> etag``:
  unconditional by default; ``if_none_match=True`` creates only if absent (else
  `PreconditionFailed`); ``if_match=etag`` replaces only if the current ETag equals it
  (else `PreconditionFailed`, also when the key is absent). Both at once is a caller bug.
  Creation and replacement are atomic: readers see the old or the new body, never a mix.
- ``list(prefix, start_after=None)``: async iterator of `ObjectInfo` for every key that
  starts with ``prefix`` and sorts after ``start_after``, in S3 order (bytewise order of
  the UTF-8 encoding of the whole key). Pages are fetched lazily; memory stays bounded.
- ``delete(key)``: removes the object; deleting an absent key is not an error (as in S3).
- ``close()``: release connections and files.

ETags are opaque strings: compare them only for equality, and only from the same store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """Metadata of one stored object."""

    key: str
    size: int
    etag: str
    last_modified_ns: int


@runtime_checkable
class ObjectStore(Protocol):
    """An object store with S3 semantics, including conditional writes."""

    url: str

    async def get(self, key: str) -> tuple[bytes, str]: ...

    async def head(self, key: str) -> ObjectInfo: ...

    async def put(
        self,
        key: str,
        body: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str: ...

    def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]: ...

    async def delete(self, key: str) -> None: ...

    async def close(self) -> None: ...


async def list_prefixes(store: ObjectStore, prefixes: Iterable[str]) -> AsyncIterator[ObjectInfo]:
    """Every object under each of ``prefixes`` in turn (prefixes that do not overlap)."""
    for prefix in prefixes:
        async for info in store.list(prefix):
            yield info


def check_key(op: str, key: str) -> None:
    """Raise `ValueError` naming the problem unless ``key`` is a valid object key."""
    if not key:
        raise ValueError(f"{op}: empty key")
    if key.startswith("/"):
        raise ValueError(f"{op} {key!r}: key must not start with '/'")
    for segment in key.split("/"):
        if segment in ("", ".", ".."):
            raise ValueError(f"{op} {key!r}: empty, '.' or '..' path segment")
    if "\x00" in key:
        raise ValueError(f"{op} {key!r}: NUL byte in key")


def check_put_conditions(key: str, if_none_match: bool, if_match: str | None) -> None:
    """Refuse a put that asks for both conditions at once (a caller bug)."""
    if if_none_match and if_match is not None:
        raise ValueError(f"put {key!r}: if_none_match and if_match are exclusive")
