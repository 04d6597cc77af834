"""Memory settings of a collector worker process, applied before it serves.

Measured with `bench.ingest` (500 concurrent 64 KiB uploads, one worker; bench/RESULTS.md):

- **No pandas.** pyarrow imports pandas, when it is installed (the ``rollup`` extra
  installs it), the first time it converts a Python value to Arrow: +35..42 MiB per
  worker, for nothing the collector does. `refuse_pandas` makes ``import pandas`` fail
  in this process, so pyarrow's pandas integration stays off.
- **Two malloc arenas.** glibc gives each thread that allocates its own arena (up to
  8 x cores); the frame-check threads and the default executor's threads each keep one,
  and freed body and table buffers stay spread over them. `limit_malloc_arenas` caps
  the process at two (``M_ARENA_MAX``, as ``MALLOC_ARENA_MAX=2`` would), before the
  threads start. Not glibc (or no ``mallopt``): nothing happens.
- **Arrow on malloc** (`use_system_allocator_for_arrow`): see there.
- **Large blocks mapped** in a query collector (`fix_mmap_threshold`, called by the read
  path's `collector.query.endpoint.QueryEndpoint`): see there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.abc
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

M_ARENA_MAX = -8  # glibc <malloc.h>
M_MMAP_THRESHOLD = -3
READ_MMAP_THRESHOLD = 1 << 20
MALLOC_ARENAS = 2
REFUSED_MODULES = ("pandas",)


class _RefuseModules(importlib.abc.MetaPathFinder):
    """``import pandas`` raises ImportError in this process (pyarrow then runs without
    its pandas integration, as when pandas is not installed)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname.partition(".")[0] in REFUSED_MODULES:
            raise ImportError(f"{fullname} is not imported by collector workers (memory)")
        return None


def refuse_pandas() -> bool:
    """Make pandas unimportable here; False when it was imported already (then it stays)."""
    if any(name in sys.modules for name in REFUSED_MODULES):
        return False
    if not any(isinstance(finder, _RefuseModules) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RefuseModules())
    return True


def _mallopt(param: int, value: int) -> bool:
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(param, value))


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """``mallopt(M_ARENA_MAX, arenas)``; False where that is not available."""
    return _mallopt(M_ARENA_MAX, arenas)


def fix_mmap_threshold(threshold: int = READ_MMAP_THRESHOLD) -> bool:
    """``mallopt(M_MMAP_THRESHOLD, threshold)`` for a process serving reads: a block of at
    least ``threshold`` bytes is its own mapping, returned to the system when freed.
    Otherwise glibc raises the threshold after a large block is freed (up to 32 MiB), so
    the read path's numpy and Arrow columns (1-100 MB each) come from the arenas and stay
    resident once freed: under 10 fleet-dashboard loops (`bench.promql`, 30 s, load 4-10)
    the query collector peaked at 1.29 GiB, with 1 MiB fixed 0.99 GiB. False where that
    is not available."""
    return _mallopt(M_MMAP_THRESHOLD, threshold)


def use_system_allocator_for_arrow() -> None:
    """Arrow buffers from malloc instead of pyarrow's default mimalloc pool, whose
    per-thread heaps keep freed pages: 4 check threads over 1,920 frames kept +12 MiB
    RssAnon with mimalloc, +5 MiB with malloc, at the same CPU per check (0.37-0.42 ms
    either way)."""
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())


def prepare_worker_process() -> None:
    """All of the above; called first thing in every process that serves."""
    refuse_pandas()
    limit_malloc_arenas()
    use_system_allocator_for_arrow()
