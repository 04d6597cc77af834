"""The `ObjectStore` protocol: the one seam between Lightmetrics and its system of record.

Keys are relative to the store's root (a directory for ``file://``, ``bucket/prefix`` for
``s3://``); they are non-empty UTF-8 strings of ``/``-separated segments, none of them
empty, ``.`` or ``..``, and never start with ``/``.

Contract, shared by every implementation and checked by ``tests/store/test_contract.py``:

- ``get(key) -> (body, etag)``; `NotFound` when absent.
- ``get_if_none_match(key, etag) -> (body, etag) | None`` (optional, `ConditionalGet`):
  a GET with ``If-None-Match: etag``. ``None`` when the object's ETag still equals
  ``etag`` (HTTP 304: no body sent, one request); else as ``get``. Use it through
  `get_if_changed`, which falls back to a plain ``get`` for stores without it.
- ``get_range(key, offset, length) -> bytes``: one GET of ``length`` bytes from byte
  ``offset`` (HTTP ``Range: bytes=offset-(offset+length-1)``): the object's bytes
  ``[offset, offset + length)``, fewer when the object ends first (none when it ends at
  or before ``offset``: S3's 416); `NotFound` when absent. ``offset >= 0`` and
  ``1 <= length <= MAX_RANGE_BYTES`` (whole ints), else `ValueError` and nothing sent:
  `check_range`. Only ``length`` bytes are read or held, never the whole object.
- ``head(key) -> ObjectInfo``; `NotFound` when absent.
- ``put(key, body, *, if_none_match=False, if_match=None) -> etag``:
  unconditional by default; ``if_none_match=True`` creates only if absent (else
  `PreconditionFailed`); ``if_match=etag`` replaces only if the current ETag equals it
  (else `PreconditionFailed`, also when the key is absent). Both at once is a caller bug.
  Creation and replacement are atomic: readers see the old or the new body, never a mix.
- ``put_file(key, path, *, if_none_match=False, if_match=None) -> etag``: ``put`` of the
  local file at ``path`` (its bytes when called), with the same conditions and atomicity,
  read from the file in bounded pieces: never the whole body in memory (S3: a multipart
  upload above `PUT_FILE_PART_BYTES`, aborted on failure; fs: copied into a temporary
  file and published as ``put`` publishes). For big files a store writes (merged catalog
  files); the file must not change during the call.
- ``list(prefix, start_after=None)``: async iterator of `ObjectInfo` for every key that
  starts with ``prefix`` and sorts after ``start_after``, in S3 order (bytewise order of
  the UTF-8 encoding of the whole key). Pages are fetched lazily; memory stays bounded.
- ``common_prefixes(prefix)``: async iterator, in S3 order, of the distinct "folders"
  directly under ``prefix``: for every key ``prefix + rest`` whose ``rest`` holds a
  ``/``, ``prefix + rest[: rest.index("/") + 1]`` once (S3's ListObjectsV2 with
  ``Delimiter="/"``, its ``CommonPrefixes``). Keys with no ``/`` after ``prefix`` are
  not reported. Paginated like ``list``; memory stays bounded.
- ``delete(key)``: removes the object; deleting an absent key is not an error (as in S3).
- ``sign_delete(key, *, expires_in_s) -> SignedDelete`` and
  ``send_signed_delete(request)``: a DELETE that cannot land late (PROTOCOL §3.5 rule 6).
  Signing sends nothing. The signed request is sent once, never repeated by the store
  (and never re-sent or re-signed by the caller); the store refuses it with
  `RequestExpired` when it arrives more than ``expires_in_s`` after it was signed, judged
  by the store's own clock (S3: ``X-Amz-Date`` + ``X-Amz-Expires``; the memory and
  filesystem stores emulate that with their injected clock). Other failures say whether it
  may have been applied: `Unavailable` (refused or not sent: nothing applied) or
  `OutcomeUnknown` (it may still land, but never after its expiry). Deleting an absent key
  succeeds, as ``delete`` does.
- ``close()``: release connections and files.

ETags are opaque strings: compare them only for equality, and only from the same store.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Protocol, cast, runtime_checkable


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """Metadata of one stored object."""

    key: str
    size: int
    etag: str
    last_modified_ns: int


PUT_FILE_PART_BYTES = 16 * 1024 * 1024
"""How much of a file `ObjectStore.put_file` holds at once (S3: its multipart part size)."""

MAX_RANGE_BYTES = 1 << 31
"""The longest range `ObjectStore.get_range` reads at once (2 GiB): a bound on what one
call holds in memory, far above any raw object (PROTOCOL §3.10: a bundle's largest size)."""

MAX_SIGNED_EXPIRY_S = 7 * 24 * 3600
"""S3's longest pre-signed URL lifetime (``X-Amz-Expires``): one week."""


@dataclass(frozen=True, slots=True)
class SignedDelete:
    """A DELETE of ``key`` signed once, valid for ``expires_in_s`` from its signing.

    ``signed_at_unix_ns`` is the signer's clock (S3 truncates it to whole seconds in
    ``X-Amz-Date``, so the request expires no later than this plus ``expires_in_s``).
    ``url`` is the pre-signed request for S3, empty for stores that check expiry
    themselves. Only the store that signed it can send it."""

    key: str
    expires_in_s: int
    signed_at_unix_ns: int
    url: str = field(default="", repr=False)  # carries a signature: keep it out of logs

    @property
    def expires_at_unix_ns(self) -> int:
        return self.signed_at_unix_ns + self.expires_in_s * 1_000_000_000


@runtime_checkable
class ObjectStore(Protocol):
    """An object store with S3 semantics, including conditional writes."""

    url: str

    async def get(self, key: str) -> tuple[bytes, str]: ...

    async def get_range(self, key: str, offset: int, length: int) -> bytes: ...

    async def head(self, key: str) -> ObjectInfo: ...

    async def put(
        self,
        key: str,
        body: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str: ...

    async def put_file(
        self,
        key: str,
        path: str,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str: ...

    def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]: ...

    def common_prefixes(self, prefix: str) -> AsyncIterator[str]: ...

    async def delete(self, key: str) -> None: ...

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete: ...

    async def send_signed_delete(self, request: SignedDelete) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class ConditionalGet(Protocol):
    """A store that can answer a GET with 304 Not Modified (memory, fs, S3).

    Kept apart from `ObjectStore` so wrappers (fault injection, counting stores in
    tests) need not implement it: `get_if_changed` works with either."""

    async def get_if_none_match(self, key: str, etag: str) -> tuple[bytes, str] | None: ...


async def get_if_changed(
    store: ObjectStore, key: str, etag: str | None
) -> tuple[bytes, str] | None:
    """``(body, etag)`` of ``key`` unless its ETag is still ``etag`` (then ``None``).

    ``etag=None`` is a plain ``get``. One conditional GET where the store has one (a 304
    carries no body); otherwise a plain ``get`` whose ETag is compared here (same answer,
    full cost). `NotFound` when absent."""
    if etag is not None and isinstance(store, ConditionalGet):
        return await store.get_if_none_match(key, etag)
    body, current = await store.get(key)
    return None if current == etag else (body, current)


class BoundedListing(Protocol):
    """A store that lists up to a last key without reading ahead past it (S3).

    ``list_until(prefix, start_after, until)``: as ``list``, ending after the last key
    ``<= until``. Kept apart from `ObjectStore` (wrappers need not forward it): use it
    through `list_range`, which stops a plain ``list`` at the same key (and uses this
    only where the store's class defines it)."""

    def list_until(
        self, prefix: str, start_after: str | None, until: str
    ) -> AsyncIterator[ObjectInfo]: ...


async def list_range(
    store: ObjectStore, prefix: str, start_after: str | None, until: str | None
) -> AsyncGenerator[ObjectInfo, None]:
    """Keys under ``prefix`` after ``start_after`` up to ``until`` (``None``: no end); a
    store that reads pages ahead (`BoundedListing`) reads none past ``until``."""
    # The class must define it: a wrapper forwarding by ``__getattr__`` would otherwise
    # hand the listing to its inner store behind its own ``list`` (counting, faults).
    if until is not None and callable(getattr(type(store), "list_until", None)):
        listing = cast(BoundedListing, store).list_until(prefix, start_after, until)
    else:
        listing = store.list(prefix, start_after)
    try:
        async for info in listing:
            if until is not None and info.key > until:
                return
            yield info
    finally:
        if isinstance(listing, AsyncGenerator):
            await listing.aclose()  # now, not at garbage collection: a page ahead stops


async def list_prefixes(
    store: ObjectStore, prefixes: Iterable[str], *, start_after: str | None = None
) -> AsyncGenerator[ObjectInfo, None]:
    """Every object under each of ``prefixes`` in turn (prefixes that do not overlap).

    ``start_after`` resumes a listing after a key it returned: the prefixes before the
    one holding it are skipped and that one is listed after it (S3's StartAfter), the
    rest in full. A ``start_after`` under none of ``prefixes`` is a caller bug
    (`ValueError`): check untrusted input before."""
    todo = list(prefixes)
    after = start_after
    if after is not None:
        holding = [i for i, prefix in enumerate(todo) if after.startswith(prefix)]
        if not holding:
            raise ValueError(f"start_after {after!r} is under none of {todo!r}")
        todo = todo[holding[0] :]
    for prefix in todo:
        listing = store.list(prefix, after)
        try:
            async for info in listing:
                yield info
        finally:
            if isinstance(listing, AsyncGenerator):
                await listing.aclose()  # when the caller stops early: no page read ahead
        after = None


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


def check_range(key: str, offset: int, length: int) -> None:
    """Refuse a range `ObjectStore.get_range` cannot send: whole ints, ``offset >= 0``,
    ``1 <= length <= MAX_RANGE_BYTES`` (HTTP has no empty range)."""
    for name, value in (("offset", offset), ("length", length)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"get_range {key!r}: {name} must be an int, got {value!r}")
    if offset < 0:
        raise ValueError(f"get_range {key!r}: offset must be >= 0, got {offset}")
    if not 1 <= length <= MAX_RANGE_BYTES:
        raise ValueError(
            f"get_range {key!r}: length must be in [1, {MAX_RANGE_BYTES}], got {length}"
        )


def check_put_conditions(key: str, if_none_match: bool, if_match: str | None) -> None:
    """Refuse a put that asks for both conditions at once (a caller bug)."""
    if if_none_match and if_match is not None:
        raise ValueError(f"put {key!r}: if_none_match and if_match are exclusive")


def check_signed_expiry(key: str, expires_in_s: int) -> None:
    """Refuse an expiry S3 would refuse: whole seconds in ``[1, MAX_SIGNED_EXPIRY_S]``."""
    if isinstance(expires_in_s, bool) or not isinstance(expires_in_s, int):
        raise ValueError(f"sign_delete {key!r}: expires_in_s must be whole seconds")
    if not 1 <= expires_in_s <= MAX_SIGNED_EXPIRY_S:
        raise ValueError(
            f"sign_delete {key!r}: expires_in_s must be in [1, {MAX_SIGNED_EXPIRY_S}], "
            f"got {expires_in_s}"
        )
