"""What bounds a worker's memory (issue 15 item 4): bodies beyond ``max_bodies_held`` wait
unread instead of being refused; a serving process never imports pandas."""

from __future__ import annotations

import asyncio
import dataclasses
import platform
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.collector.conftest import CollectorLauncher, make_frame, post_frame
from tests.collector.inprocess import LIMITS, WRITER_TOKEN, in_process_collector


async def test_a_request_past_the_body_limit_waits_unread_then_is_accepted() -> None:
    limits = dataclasses.replace(LIMITS, max_bodies_held=1)
    slow_started, release = asyncio.Event(), asyncio.Event()
    slow = make_frame("agent-slow-body")

    async def slow_body() -> AsyncIterator[bytes]:
        yield slow[:10]
        slow_started.set()
        await asyncio.wait_for(release.wait(), timeout=30)
        yield slow[10:]

    async with in_process_collector(limits=limits) as collector:
        async with aiohttp.ClientSession() as first, aiohttp.ClientSession() as second:
            held = asyncio.create_task(
                post_frame(first, collector.base_url, slow_body(), token=WRITER_TOKEN)
            )
            await asyncio.wait_for(slow_started.wait(), timeout=30)
            waiting = asyncio.create_task(
                post_frame(
                    second, collector.base_url, make_frame("agent-waits"), token=WRITER_TOKEN
                )
            )
            deadline = time.monotonic() + 30
            while collector.app.in_flight < 2:  # both admitted: one reads, one waits
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)  # polling with a deadline
            assert not waiting.done()  # not refused: it waits for the body slot
            release.set()
            answers = await asyncio.gather(held, waiting)
    assert [a.status for a in answers] == [200, 200], answers
    assert [a.json["duplicate"] for a in answers] == [False, False]


def test_a_serving_process_refuses_pandas() -> None:
    """pyarrow converts Python values (as the checks do) without importing pandas."""
    code = (
        "import sys\n"
        "from collector.process_memory import prepare_worker_process\n"
        "prepare_worker_process()\n"
        "import pyarrow as pa\n"
        "pa.array([1, 2, 3]); pa.table({'a': [1]})\n"
        "assert pa.default_memory_pool().backend_name == 'system', pa.default_memory_pool()\n"
        "print('pandas' in sys.modules, pa.lib._pandas_api.have_pandas)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == ["False", "False"], out


async def test_a_collector_worker_has_no_pandas_mapped_after_a_batch(
    collectors: CollectorLauncher, tmp_path: Path
) -> None:
    collector = collectors.start(store_url=f"file://{tmp_path / 'store'}")
    async with aiohttp.ClientSession() as session:
        answer = await post_frame(session, collector.base_url, make_frame("agent-nopandas"))
    assert answer.status == 200, answer
    maps = await asyncio.to_thread(Path(f"/proc/{collector.pid}/maps").read_text)
    assert "pyarrow" in maps  # the check ran in this process
    assert "/pandas/" not in maps


_RETAINED = """
import sys
import numpy as np
from pathlib import Path
from collector.process_memory import fix_mmap_threshold
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold()
def rss():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
big = np.ones(24 << 20, np.uint8)
del big  # glibc (unfixed) raises its mmap threshold to 24 MiB here (max 32)
before = rss()
a = np.ones(16 << 20, np.uint8)
b = np.ones(16 << 20, np.uint8)
del a  # below b: not at the heap's top
print(rss() - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_a_query_collector_gives_freed_columns_back() -> None:
    def retained(mode: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", _RETAINED, mode],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return int(out.stdout.split()[-1]) - (16 << 20)  # b is live in both

    assert retained("dynamic") > 12 << 20  # a's 16 MiB stayed resident
    assert retained("fixed") < 4 << 20  # a's mapping went back
