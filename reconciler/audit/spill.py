"""The local engine's spill directory: ``lm-audit-*`` under ``reconciler.audit_spill_dir``
(the system's temporary directory by default), removed when the audit ends.

An audit killed with kill -9 cannot remove its directory, and a large store's spill holds
gigabytes (the catalog and listing copies, DuckDB's spill files). So each directory holds
an exclusive `fcntl.flock` on its ``.lock`` file while its audit runs — the kernel drops
it when the process dies, however it dies — and a new audit first removes every
``lm-audit-*`` directory whose lock nobody holds. Several reconcilers (of other buckets)
may share the root: a directory whose lock is held is another live audit's, and stays.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator

import structlog

log = structlog.get_logger(__name__)
PREFIX = "lm-audit-"
LOCK = ".lock"


@contextlib.contextmanager
def spill_directory(root: str | None) -> Iterator[str]:
    """A fresh spill directory under ``root`` (locked while in use, removed after), once
    the directories crashed audits left there are removed."""
    if root is not None:
        os.makedirs(root, exist_ok=True)
    base = root if root is not None else tempfile.gettempdir()
    sweep(base)
    # Made under another name and locked before it is renamed into the swept namespace:
    # a sweep never sees an ``lm-audit-*`` directory whose owner has not locked it yet.
    making = tempfile.mkdtemp(prefix=f".{PREFIX}", dir=base)
    fd = os.open(os.path.join(making, LOCK), os.O_CREAT | os.O_RDWR, 0o600)
    spill = os.path.join(base, os.path.basename(making)[1:])
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(making, spill)
        yield spill
    finally:
        shutil.rmtree(spill if os.path.isdir(spill) else making, ignore_errors=True)
        os.close(fd)  # releases the lock, after the directory is gone


def sweep(base: str) -> list[str]:
    """Remove the ``lm-audit-*`` directories under ``base`` no live audit holds; returns
    them."""
    removed: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(base):
            if entry.name.startswith(PREFIX) and entry.is_dir(follow_symlinks=False):
                if _unheld(entry.path):
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed.append(entry.path)
    if removed:
        log.warning("audit_spill_swept", directories=len(removed), base=base)
    return removed


def _unheld(path: str) -> bool:
    """No process holds ``path``'s lock (or it has none: a crash before it was made)."""
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDWR)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # not ours to judge (permissions): leave it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True
