"""The system `bench.cost` measures: MiniStack, one counting proxy per process role, and
our real processes (``lm-collector serve``, ``lm-reconciler run``/``audit``/``gc``,
``lm-rollup run``) pointed at their role's proxy, all with the deployment's default
settings except where `CostStack.env` says.

Every child is stopped by its own PID (collectors, the reconciler) or its own process
group (one-shot commands and ``lm-rollup run``, whose Spark JVM is its child): SIGTERM
with a bounded wait, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from bench._common import REPO_ROOT
from bench.counting import CountingProxy
from chaos.processes import ProcessInfo, spawn_python, terminate
from chaos.s3_server import CREDENTIALS, RunningServer, child_env, start_ministack
from collector.launch import CollectorProcess, start_collector
from store.base import ObjectStore
from store.open import open_store

STORE_PREFIX = "lm"
STOP_TIMEOUT_S = 30.0


@dataclass
class CostStack:
    work_dir: Path
    settings: dict[str, str] = field(default_factory=dict)
    """``LM_*`` overrides given to every child (on top of the defaults)."""
    ministack: RunningServer | None = None
    proxies: dict[tuple[str, str], CountingProxy] = field(default_factory=dict)
    buckets: list[str] = field(default_factory=list)
    collectors: list[CollectorProcess] = field(default_factory=list)
    children: list[ProcessInfo] = field(default_factory=list)
    stores: list[ObjectStore] = field(default_factory=list)

    async def start(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # From the main thread, blocking: MiniStack is told to stop when the thread that
        # started it ends (PR_SET_PDEATHSIG), and an executor thread may end first.
        self.ministack = start_ministack(self.work_dir / "ministack")

    async def new_bucket(self, name: str) -> str:
        assert self.ministack is not None
        bucket = f"lm-cost-{name}-{os.getpid() % 100000:05d}"
        await asyncio.to_thread(self.ministack.create_bucket, bucket)
        self.buckets.append(bucket)
        return bucket

    async def proxy(self, bucket: str, role: str) -> CountingProxy:
        """The counting proxy of ``role`` in front of ``bucket`` (started on first use)."""
        assert self.ministack is not None
        if (bucket, role) not in self.proxies:
            proxy = CountingProxy(
                upstream=self.ministack.endpoint_url, bucket=bucket, prefix=STORE_PREFIX
            )
            await proxy.start()
            self.proxies[(bucket, role)] = proxy
        return self.proxies[(bucket, role)]

    def direct_store(self, bucket: str) -> ObjectStore:
        """The bucket without a proxy: seeding and checks, never counted."""
        assert self.ministack is not None
        store = open_store(
            f"s3://{bucket}/{STORE_PREFIX}",
            endpoint_url=self.ministack.endpoint_url,
            credentials=CREDENTIALS,
            read_timeout_s=60.0,
        )
        self.stores.append(store)
        return store

    def env(self, bucket: str, endpoint_url: str, **extra: str) -> dict[str, str]:
        return child_env(
            {
                "LM_STORE__URL": f"s3://{bucket}/{STORE_PREFIX}",
                "LM_STORE__ENDPOINT_URL": endpoint_url,
                "LM_METRICS__ENABLED": "false",
                "LM_LOGGING__FORMAT": "json",
                "LM_LOGGING__LEVEL": "warning",
                **self.settings,
                **extra,
            }
        )

    def direct_env(self, bucket: str, **extra: str) -> dict[str, str]:
        assert self.ministack is not None
        return self.env(bucket, self.ministack.endpoint_url, **extra)

    async def start_collector(self, name: str, env: dict[str, str]) -> CollectorProcess:
        env = {**env, "LM_INGEST__COLLECTOR_ID": name}
        process = await asyncio.to_thread(
            start_collector, work_dir=self.work_dir / "logs", name=name, env=env, timeout_s=120.0
        )
        self.collectors.append(process)
        return process

    async def stop_collectors(self) -> None:
        """SIGTERM: each flushes its index log buffer, then exits."""
        stopping, self.collectors = self.collectors, []
        await asyncio.gather(*(asyncio.to_thread(c.stop, STOP_TIMEOUT_S) for c in stopping))

    def spawn(self, name: str, args: list[str], env: dict[str, str]) -> ProcessInfo:
        """`chaos.processes.spawn_python` from the repository root; `stop_child` stops it."""
        child = spawn_python(self.work_dir / "logs", name, args, env, cwd=REPO_ROOT)
        self.children.append(child)
        return child

    async def run_to_end(
        self, name: str, args: list[str], env: dict[str, str], timeout_s: float
    ) -> tuple[int, float]:
        """Run a one-shot command; ``(exit code, seconds)``. Raises if it fails."""
        if "rollup" in args:
            tmp = self.work_dir / "spark-tmp" / name
            tmp.mkdir(parents=True, exist_ok=True)
            env = {**env, "TMPDIR": str(tmp)}
        started = time.monotonic()
        child = self.spawn(name, args, env)
        try:
            code = await asyncio.to_thread(child.process.wait, timeout_s)
        except subprocess.TimeoutExpired:
            code = await asyncio.to_thread(stop_child, child)
        finally:
            self.children.remove(child)
            shutil.rmtree(self.work_dir / "spark-tmp" / name, ignore_errors=True)
        if code != 0:
            raise RuntimeError(f"{name} ({' '.join(args)}) exited with {code}:\n{child.tail()}")
        return code, time.monotonic() - started

    async def stop(self) -> None:
        """Stop everything still running, by PID or own group, then the proxies."""
        for child in list(self.children):
            await asyncio.to_thread(stop_child, child)
        self.children.clear()
        await self.stop_collectors()
        for store in self.stores:
            await store.close()
        for proxy in self.proxies.values():
            await proxy.stop()
        if self.ministack is not None:
            await asyncio.to_thread(self.ministack.stop)


def stop_child(child: ProcessInfo) -> int:
    """SIGTERM the child's group, wait up to `STOP_TIMEOUT_S`, then SIGKILL it."""
    return terminate(child, STOP_TIMEOUT_S)


T = TypeVar("T")


async def on_cost_stack(work_dir: Path, measure: Callable[[CostStack], Awaitable[T]]) -> T:
    """``measure`` on a `CostStack` started in ``work_dir``, stopped however it ends."""
    stack = CostStack(work_dir)
    try:
        await stack.start()
        return await measure(stack)
    finally:
        await stack.stop()
