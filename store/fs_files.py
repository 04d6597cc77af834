"""The file operations the filesystem store is built of (`store.fs`): reading an object
with its metadata from one open file, publishing a temporary file atomically (``link``
for create-if-absent, ``rename`` to replace), fsync of directories, quiet unlinks."""

from __future__ import annotations

import os

from store.base import ObjectInfo
from store.errors import NotFound, PreconditionFailed, StoreError, Unavailable
from store.fs_listing import GONE
from store.memory import body_etag


class KeyNotStorable(StoreError, ValueError):
    """The filesystem store cannot hold this key. Final: the key layout must change."""


class KeyPathConflict(KeyNotStorable):
    """One path would have to be both a file and a directory (keys ``a`` and ``a/b``)."""


class KeySegmentTooLong(KeyNotStorable):
    """A segment of the key is longer than a file name may be (255 UTF-8 bytes)."""


def read(op: str, key: str, path: str) -> tuple[bytes, ObjectInfo]:
    """Body and metadata of the object at ``path``, both from one open file (consistent
    even if the key is replaced meanwhile)."""
    try:
        with open(path, "rb") as file:
            mtime_ns = os.fstat(file.fileno()).st_mtime_ns
            body = file.read()
    except GONE:
        raise NotFound(op, key) from None
    except OSError as exc:
        raise Unavailable(op, key, str(exc)) from exc
    return body, ObjectInfo(key, len(body), body_etag(body), mtime_ns)


def read_range(key: str, path: str, offset: int, length: int) -> bytes:
    """Up to ``length`` bytes of the object at ``path`` from ``offset`` (fewer at its end):
    a bounded read, never the whole file."""
    try:
        with open(path, "rb") as file:
            file.seek(offset)
            return file.read(length)
    except GONE:
        raise NotFound("get", key) from None
    except OSError as exc:
        raise Unavailable("get", key, str(exc)) from exc


def link_new(key: str, path: str, tmp: str) -> None:
    try:
        os.link(tmp, path)
    except FileExistsError:
        if os.path.isdir(path):
            raise IsADirectoryError(path) from None  # _commit decides: husk or conflict
        raise PreconditionFailed("put", key, "object exists (If-None-Match: *)") from None
    except NotADirectoryError:
        raise KeyPathConflict("put", key, "a parent path is an object") from None
    except (FileNotFoundError, IsADirectoryError):
        raise
    except OSError as exc:
        raise Unavailable("put", key, str(exc)) from exc


def replace(key: str, path: str, tmp: str) -> None:
    try:
        os.replace(tmp, path)
    except NotADirectoryError:
        raise KeyPathConflict("put", key, "a parent path is an object") from None
    except (FileNotFoundError, IsADirectoryError):
        raise
    except OSError as exc:
        raise Unavailable("put", key, str(exc)) from exc


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_nearest_dir(directory: str, root: str) -> None:
    """fsync ``directory``, or, when a concurrent delete pruned it (it was left empty,
    our unlink included), the nearest ancestor still there: the one that rmdir changed."""
    while True:
        try:
            fsync_dir(directory)
            return
        except FileNotFoundError:
            if directory == root:
                raise
            directory = os.path.dirname(directory)


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
