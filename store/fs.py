"""`FileSystemStore`: the embedded default store (``file://PATH``), safe for many processes.

Object ``K`` is the regular file ``PATH/K``, so operators can inspect the store with
``ls`` and ``cat``. The store keeps its own bookkeeping in ``PATH/.lm-store/`` (temporary
files and lock stripes); that name is reserved and never listed. POSIX only.

How each write is made atomic and durable (body fsync'd before it becomes visible, the
directory entry fsync'd before the call returns):

- create-if-absent: write + fsync a temporary file, then ``link()`` it to ``PATH/K``.
  ``link`` fails with EEXIST if anything is there, atomically across processes, so exactly
  one of many racing creators wins; the others get `PreconditionFailed`.
- If-Match: under an exclusive ``flock`` on the key's lock stripe (one of
  ``_LOCK_STRIPES`` files, so lock files never pile up), compare the current ETag, then
  ``rename()`` the temporary file over ``PATH/K``. Unconditional puts and deletes take the
  same lock, so a compare-and-swap never overwrites or resurrects a concurrent change.
- unconditional put: ``rename()`` under the key lock.

ETags are the quoted MD5 of the content (what S3 gives for single-part uploads), computed
on read. Content hashes stay correct however inodes and timestamps are reused; the cost
is that `head` and `list` read every object they report.

``last_modified_ns`` is the file's mtime, set from the injected clock when written. That
clock is also the store's clock for signed deletes: one sent after its expiry is refused
(`RequestExpired`).

Limitations of a directory tree, each a `KeyNotStorable` (a `StoreError`: final, the key
layout must change) on put:

- a path cannot be a file and a directory at once, so the keys ``a`` and ``a/b`` cannot
  coexist; the second put raises `KeyPathConflict`. PROTOCOL's key layout never needs both.
- a segment longer than 255 UTF-8 bytes (NAME_MAX) cannot be a file name: `KeySegmentTooLong`.
  PROTOCOL §3's segment rule keeps every key within it. No object can exist at such a key,
  so reads answer `NotFound`, deletes do nothing, and listings under it are empty (as S3
  answers for any key nobody wrote): a reader looking for the long form a store written
  before the rule may hold (`protocol.keys.legacy_accepted_manifest_key`) needs no case
  of its own.
Temporary files of a process killed mid-write stay in ``.lm-store/tmp``; they are never
visible as objects and can be removed by hand.
"""

from __future__ import annotations

import asyncio
import builtins
import fcntl
import hashlib
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from protocol.clock import Clock, SystemClock
from store.base import (
    PUT_FILE_PART_BYTES,
    ObjectInfo,
    SignedDelete,
    check_key,
    check_put_conditions,
    check_range,
    check_signed_expiry,
)
from store.errors import NotFound, OutcomeUnknown, PreconditionFailed, RequestExpired, Unavailable
from store.fs_files import KeyNotStorable as KeyNotStorable
from store.fs_files import KeyPathConflict as KeyPathConflict
from store.fs_files import KeySegmentTooLong as KeySegmentTooLong
from store.fs_files import (
    fsync_dir,
    fsync_nearest_dir,
    link_new,
    read,
    read_range,
    replace,
    unlink_quietly,
)
from store.fs_listing import GONE, NAME_MAX, RESERVED, folders, object_info, read_page, walk_prefix
from store.memory import body_etag

_LOCK_STRIPES = 1024
# A racing delete may prune a parent directory between our mkdir and our link; each
# round recreates it. More rounds than this means something keeps deleting: give up.
_COMMIT_ROUNDS = 8
# Objects read per thread hop while listing: large enough to amortise the hop, small
# enough that the first results arrive quickly.


class FileSystemStore:
    """The `ObjectStore` protocol over a directory tree.

    Errors: `NotFound`, `PreconditionFailed`, `KeyNotStorable` (`KeyPathConflict`,
    `KeySegmentTooLong`) on put, `ValueError` for invalid keys; `Unavailable` when the
    filesystem fails before a write is applied (full disk, permissions), `OutcomeUnknown`
    when it fails after (a directory fsync).
    """

    def __init__(self, root: Path, *, clock: Clock | None = None) -> None:
        self._root = os.path.abspath(root)
        self.url = f"file://{self._root}"
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._tmp = os.path.join(self._root, RESERVED, "tmp")
        self._locks = os.path.join(self._root, RESERVED, "locks")
        os.makedirs(self._tmp, exist_ok=True)
        os.makedirs(self._locks, exist_ok=True)

    @property
    def root(self) -> Path:
        return Path(self._root)

    def _path(self, op: str, key: str) -> str:
        """The file of ``key``. Raises `ValueError` for an invalid or reserved key and
        `KeySegmentTooLong` for one no file can have."""
        check_key(op, key)
        segments = key.split("/")
        if segments[0] == RESERVED:
            raise ValueError(f"{op} {key!r}: {RESERVED!r} is reserved by the filesystem store")
        if any(len(segment.encode("utf-8")) > NAME_MAX for segment in segments):
            detail = f"a path segment is longer than {NAME_MAX} bytes"
            raise KeySegmentTooLong(op, key, detail)
        return os.path.join(self._root, key)

    async def get(self, key: str) -> tuple[bytes, str]:
        try:
            path = self._path("get", key)
        except KeySegmentTooLong:
            raise NotFound("get", key) from None  # no object can be there
        body, info = await asyncio.to_thread(read, "get", key, path)
        return body, info.etag

    async def get_if_none_match(self, key: str, etag: str) -> tuple[bytes, str] | None:
        """`get`, or ``None`` when the ETag is still ``etag`` (304). The file is read
        either way (its ETag is its content's hash), but nothing is returned."""
        body, current = await self.get(key)
        return None if current == etag else (body, current)

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        try:
            path = self._path("get", key)
        except KeySegmentTooLong:
            raise NotFound("get", key) from None  # no object can be there
        check_range(key, offset, length)
        return await asyncio.to_thread(read_range, key, path, offset, length)

    async def head(self, key: str) -> ObjectInfo:
        try:
            path = self._path("head", key)
        except KeySegmentTooLong:
            raise NotFound("head", key) from None  # no object can be there
        return await asyncio.to_thread(object_info, "head", key, path)

    async def put(
        self,
        key: str,
        body: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        path = self._path("put", key)
        check_put_conditions(key, if_none_match, if_match)
        now_ns = self._clock.now_ns()
        # One thread hop for the whole operation: the syscalls are cheap, the hops are not.
        return await asyncio.to_thread(
            self._put_sync, key, path, bytes(body), now_ns, if_none_match, if_match
        )

    async def put_file(
        self,
        key: str,
        path: str,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        """`put` of the file at ``path``: copied into a temporary file a piece at a time
        (`PUT_FILE_PART_BYTES`), then published exactly as `put` publishes."""
        target = self._path("put", key)
        check_put_conditions(key, if_none_match, if_match)
        now_ns = self._clock.now_ns()

        def put_sync() -> str:
            tmp, etag = self._copy_temp(key, path, now_ns)
            return self._publish(key, target, tmp, etag, if_none_match, if_match)

        return await asyncio.to_thread(put_sync)

    def _put_sync(
        self,
        key: str,
        path: str,
        body: bytes,
        now_ns: int,
        if_none_match: bool,
        if_match: str | None,
    ) -> str:
        tmp = self._write_temp(key, body, now_ns)
        return self._publish(key, path, tmp, body_etag(body), if_none_match, if_match)

    def _publish(
        self,
        key: str,
        path: str,
        tmp: str,
        etag: str,
        if_none_match: bool,
        if_match: str | None,
    ) -> str:
        """Make the written temporary file ``tmp`` (whose ETag is ``etag``) the object."""
        try:
            if if_none_match:
                self._commit(key, path, lambda: link_new(key, path, tmp))
                return etag
            with self._key_lock(key):
                if if_match is not None:
                    try:
                        current = object_info("put", key, path).etag
                    except NotFound:
                        current = "no object"
                    if current != if_match:
                        detail = f"If-Match {if_match}, found {current}"
                        raise PreconditionFailed("put", key, detail)
                self._commit(key, path, lambda: replace(key, path, tmp))
            return etag
        finally:
            # After a link the temporary name is redundant; after a rename it is gone.
            unlink_quietly(tmp)

    def _write_temp(self, key: str, body: bytes, now_ns: int) -> str:
        tmp = os.path.join(self._tmp, secrets.token_hex(16))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(body)
                while view:
                    view = view[os.write(fd, view) :]
                os.utime(fd, ns=(now_ns, now_ns))
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            unlink_quietly(tmp)
            raise Unavailable("put", key, f"writing temporary file: {exc}") from exc
        return tmp

    def _copy_temp(self, key: str, source: str, now_ns: int) -> tuple[str, str]:
        """A temporary copy of the file ``source`` (fsync'd) and its ETag. A source that
        cannot be opened raises its `OSError` (the caller's file, as on every store)."""
        tmp = os.path.join(self._tmp, secrets.token_hex(16))
        digest = hashlib.md5(usedforsecurity=False)
        with open(source, "rb") as src:
            try:
                with open(tmp, "xb") as out:
                    while piece := src.read(PUT_FILE_PART_BYTES):
                        digest.update(piece)
                        out.write(piece)
                    out.flush()
                    os.utime(out.fileno(), ns=(now_ns, now_ns))
                    os.fsync(out.fileno())
            except OSError as exc:
                unlink_quietly(tmp)
                raise Unavailable("put", key, f"writing temporary file: {exc}") from exc
        return tmp, f'"{digest.hexdigest()}"'

    def _commit(self, key: str, path: str, publish: Callable[[], None]) -> None:
        """Run ``publish`` (link or rename onto ``path``), creating parent directories as
        needed, then fsync every directory whose entries changed."""
        parent = os.path.dirname(path)
        created: builtins.list[str] = []
        for _ in range(_COMMIT_ROUNDS):
            try:
                publish()
                break
            except FileNotFoundError:
                pass  # a parent is missing: create it below and publish again
            except IsADirectoryError:
                # An empty directory left at the key (its prune lost a race) does not hold
                # an object; remove it and publish again. A non-empty one is a real conflict.
                try:
                    os.rmdir(path)
                except OSError:
                    raise KeyPathConflict("put", key, "a directory of other keys is here") from None
                continue
            try:
                self._make_parents(key, parent, created)
            except FileNotFoundError:
                pass  # a concurrent delete pruned a directory we were creating under
        else:
            raise Unavailable("put", key, "parent directories kept disappearing")
        try:
            for directory in {parent, *(os.path.dirname(d) for d in created)}:
                fsync_dir(directory)
        except OSError as exc:
            raise OutcomeUnknown("put", key, f"written, but directory fsync failed: {exc}") from exc

    def _make_parents(self, key: str, parent: str, created: builtins.list[str]) -> None:
        """Create the missing directories above a key, appending each to ``created``
        (made here or by a racing creator: either way its parent needs an fsync)."""
        missing = []
        directory = parent
        while directory != self._root and not os.path.isdir(directory):
            missing.append(directory)
            directory = os.path.dirname(directory)
        for directory in reversed(missing):
            try:
                os.mkdir(directory)
            except FileExistsError:
                if not os.path.isdir(directory):
                    raise KeyPathConflict("put", key, f"{directory!r} is an object") from None
            except NotADirectoryError:
                raise KeyPathConflict("put", key, "a parent path is an object") from None
            except FileNotFoundError:
                raise
            except OSError as exc:
                raise Unavailable("put", key, f"creating {directory!r}: {exc}") from exc
            created.append(directory)

    @contextmanager
    def _key_lock(self, key: str) -> Iterator[None]:
        """Hold the key's lock stripe: excludes other threads and processes (each open()
        is its own open file description, so flock excludes threads of one process too)."""
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        stripe = int.from_bytes(digest[:4], "big") % _LOCK_STRIPES
        fd = os.open(os.path.join(self._locks, f"{stripe:04x}"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the only descriptor releases the lock

    async def delete(self, key: str) -> None:
        try:
            path = self._path("delete", key)
        except KeySegmentTooLong:
            return  # no object can be there: deleting an absent key is not an error
        await asyncio.to_thread(self._delete_sync, key, path)

    def _delete_sync(
        self, key: str, path: str, expired: Callable[[], bool] = lambda: False
    ) -> None:
        parent = os.path.dirname(path)
        with self._key_lock(key):
            if expired():
                raise RequestExpired("delete", key, "the signed request has expired")
            try:
                os.unlink(path)
            except GONE:
                return  # absent, or a directory of other keys (EISDIR): no object here
            except OSError as exc:
                if os.path.isdir(path):
                    return  # some systems refuse unlink(dir) with EPERM instead
                raise Unavailable("delete", key, str(exc)) from exc
            try:
                fsync_nearest_dir(parent, self._root)
            except OSError as exc:
                raise OutcomeUnknown("delete", key, f"deleted, but fsync failed: {exc}") from exc
        # Prune directories the delete left empty, so the tree does not fill with husks.
        # Best effort: rmdir refuses a non-empty directory, and a creator that loses its
        # freshly made directory to this recreates it (see _commit).
        while parent != self._root:
            try:
                os.rmdir(parent)
            except OSError:
                break
            parent = os.path.dirname(parent)

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        self._path("sign_delete", key)
        check_signed_expiry(key, expires_in_s)
        return SignedDelete(key, expires_in_s, self._clock.now_ns())

    async def send_signed_delete(self, request: SignedDelete) -> None:
        """`delete`, refused once the store's clock is past the request's expiry (checked
        under the key's lock, so the check and the unlink are one step)."""
        path = self._path("delete", request.key)

        def expired() -> bool:
            return self._clock.now_ns() > request.expires_at_unix_ns

        await asyncio.to_thread(self._delete_sync, request.key, path, expired)

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        files = walk_prefix(self._root, prefix, start_after)
        while True:
            page, done = await asyncio.to_thread(read_page, files)
            for info in page:
                yield info
            if done:
                return

    async def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        """The subdirectories under ``prefix`` that hold at least one file (a directory
        left empty by a racing delete is no folder: S3 has no empty folders)."""
        for folder in await asyncio.to_thread(folders, self._root, prefix):
            yield folder

    async def close(self) -> None:
        """Nothing is held between operations."""
