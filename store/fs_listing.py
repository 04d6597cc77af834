"""Listing the filesystem store in S3 order (`store.fs.FileSystemStore`): keys are files
under the root, a directory ``a`` sorting as ``a/``; `walk_prefix` yields ``(path, key)``
lazily, one directory listing per level held; `read_page` turns them into `ObjectInfo`
pages (an MD5 a piece at a time, as S3 lists ETags); `folders` answers a delimiter
listing (directories that hold a file: S3 has no empty folders)."""

from __future__ import annotations

import builtins
import hashlib
import os
from collections.abc import Iterator

from store.base import PUT_FILE_PART_BYTES, ObjectInfo
from store.errors import NotFound, Unavailable

RESERVED = ".lm-store"
"""The store's own bookkeeping directory under the root (temporary files, locks)."""
NAME_MAX = 255
GONE = (FileNotFoundError, NotADirectoryError, IsADirectoryError)
_LIST_BATCH = 256


def folders(root: str, prefix: str) -> builtins.list[str]:
    dir_part, _, name_prefix = prefix.rpartition("/")
    segments = dir_part.split("/") if dir_part else []
    if "\x00" in prefix or any(s in ("", ".", "..") for s in segments):
        return []
    if (segments and segments[0] == RESERVED) or any(
        len(s.encode("utf-8")) > NAME_MAX for s in segments
    ):
        return []
    found = []
    try:
        with os.scandir(os.path.join(root, dir_part)) as scan:
            for entry in scan:
                try:
                    name = entry.name.encode("utf-8")
                except UnicodeEncodeError:
                    continue  # not UTF-8: cannot be a key
                if not name.startswith(name_prefix.encode("utf-8")):
                    continue
                if not dir_part and entry.name == RESERVED:
                    continue
                if entry.is_dir(follow_symlinks=False) and _holds_a_file(entry.path):
                    found.append(name + b"/")
    except GONE:
        return []
    base = (dir_part + "/").encode("utf-8") if dir_part else b""
    return [(base + name).decode("utf-8") for name in sorted(found)]


def walk_prefix(root: str, prefix: str, start_after: str | None) -> Iterator[tuple[str, str]]:
    """(path, key) of every file whose key starts with ``prefix``, after ``start_after``."""
    dir_part, _, name_prefix = prefix.rpartition("/")
    segments = dir_part.split("/") if dir_part else []
    if "\x00" in prefix or any(s in ("", ".", "..") for s in segments):
        return iter(())  # no valid key starts with this prefix
    if segments and segments[0] == RESERVED:
        return iter(())
    if any(len(s.encode("utf-8")) > NAME_MAX for s in segments):
        return iter(())  # no directory can have this name: no key starts with it
    dir_key = (dir_part + "/").encode("utf-8") if dir_part else b""
    after = start_after.encode("utf-8") if start_after is not None else None
    directory = os.path.join(root, dir_part)
    return _walk(directory, dir_key, name_prefix.encode("utf-8"), after)


def _walk(
    directory: str, dir_key: bytes, name_prefix: bytes, after: bytes | None
) -> Iterator[tuple[str, str]]:
    """Depth-first, lazily, in S3 order.

    S3 order is bytewise order of whole keys, and ``a-c`` < ``a/b`` < ``a0``, so a
    directory ``a`` must sort as ``a/``: its keys are exactly those starting with
    ``a/``. Sorting each directory's files by name and its subdirectories by name + "/"
    therefore yields keys in S3 order; only one directory listing per level is held.
    """
    entries = []
    try:
        with os.scandir(directory) as scan:
            for entry in scan:
                try:
                    name = entry.name.encode("utf-8")
                except UnicodeEncodeError:
                    continue  # not UTF-8: cannot be a key
                if not name.startswith(name_prefix):
                    continue
                if not dir_key and entry.name == RESERVED:
                    continue  # the store's own bookkeeping
                if entry.is_dir(follow_symlinks=False):
                    entries.append((name + b"/", entry.path, True))
                elif entry.is_file(follow_symlinks=False):
                    entries.append((name, entry.path, False))
    except GONE:
        return  # pruned or replaced while we walked: nothing here now
    entries.sort()
    for sort_name, path, is_dir in entries:
        key = dir_key + sort_name
        if after is not None:
            if is_dir and after.startswith(key):
                yield from _walk(path, key, b"", after)
                after = None
                continue
            if key <= after:
                continue  # the file, or the whole subtree, sorts before start_after
            after = None  # entries are sorted: everything from here on is after it
        if is_dir:
            yield from _walk(path, key, b"", None)
        else:
            yield path, key.decode("utf-8")


def _holds_a_file(directory: str) -> bool:
    """Whether any regular file lies under ``directory`` (stops at the first)."""
    try:
        with os.scandir(directory) as scan:
            for entry in scan:
                if entry.is_file(follow_symlinks=False):
                    return True
                if entry.is_dir(follow_symlinks=False) and _holds_a_file(entry.path):
                    return True
    except GONE:
        return False
    return False


def object_info(op: str, key: str, path: str) -> ObjectInfo:
    """`_read`'s metadata without holding the body: its MD5 is computed a piece at a time."""
    digest = hashlib.md5(usedforsecurity=False)
    size = 0
    try:
        with open(path, "rb") as file:
            mtime_ns = os.fstat(file.fileno()).st_mtime_ns
            while piece := file.read(PUT_FILE_PART_BYTES):
                digest.update(piece)
                size += len(piece)
    except GONE:
        raise NotFound(op, key) from None
    except OSError as exc:
        raise Unavailable(op, key, str(exc)) from exc
    return ObjectInfo(key, size, f'"{digest.hexdigest()}"', mtime_ns)


def read_page(files: Iterator[tuple[str, str]]) -> tuple[builtins.list[ObjectInfo], bool]:
    page = []
    for path, key in files:
        try:
            page.append(object_info("list", key, path))
        except NotFound:
            continue  # deleted after the directory was read: S3 would not list it either
        if len(page) == _LIST_BATCH:
            return page, False
    return page, True
