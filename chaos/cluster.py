"""The system under test of one chaos run: MiniStack, the fault proxy, and our processes.

`Cluster` starts MiniStack (loopback, data under the run's directory), creates the bucket,
puts a `FaultProxy` in front of it, and starts ``lm-collector`` processes (optionally with
a skewed clock), the ``lm-reconciler run`` daemon and ``lm-rollup run`` jobs, every one
with ``store.endpoint_url`` pointing at the proxy. Every child is stopped by its own PID:
SIGTERM with a bounded wait, then SIGKILL; `kill_*` is SIGKILL now (a crash).

`direct_store()` opens the bucket *without* the proxy: the auditor and the scenario's
own setup writes use it, so their reads are never faulted.

Timing knobs (`Timing`) are scaled down from production so a run converges in seconds,
and keep the configuration rule PROTOCOL §3.5 needs: ``gc.mark_grace_s`` >
``ingest.request_budget_s + store.connect_timeout_s + store.read_timeout_s``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from chaos.processes import (
    ProcessInfo,
    kill,
    kill_group,
    launch_collector,
    signal_group,
    spawn_python,
    terminate,
)
from chaos.proxy import FaultProxy
from chaos.s3_server import CREDENTIALS, RunningServer, child_env, start_ministack
from chaos.skewed_collector import SKEW_ENV
from collector.launch import CollectorProcess, LaunchError
from store.base import ObjectStore
from store.open import open_store

log = structlog.get_logger("chaos.cluster")
STORE_PREFIX = "lm"


@dataclass(frozen=True, slots=True)
class Timing:
    request_budget_s: float = 2.0
    connect_timeout_s: float = 1.0
    read_timeout_s: float = 2.0
    grace_margin_s: float = 1.0
    retry_horizon_s: float = 4.0
    lease_ttl_s: float = 6.0
    delete_expiry_s: int = 1  # at most a third of the lease (config validation)
    max_clock_skew_s: float = 2.0
    """``store.max_clock_skew_s`` of every process (all share this host's clock): a signed
    delete plus this skew must fit in two thirds of the short lease, or the reconciler
    refuses to run its GC at all."""
    loop_interval_s: float = 1.0
    rollup_lease_ttl_s: float = 10.0
    max_audit_interval_s: float = 60.0
    """Listing audits at least this often, whether or not the GC asks for one."""
    catalog_grace_s: float = 20.0
    """Compacted catalog files are deleted this long after the merge (while rollups and
    audits read the catalog)."""

    @property
    def mark_grace_s(self) -> float:
        return (
            self.request_budget_s
            + self.connect_timeout_s
            + self.read_timeout_s
            + self.grace_margin_s
        )


@dataclass
class Cluster:
    work_dir: Path
    seed: int
    timing: Timing = field(default_factory=Timing)
    bucket: str = ""
    ministack: RunningServer | None = None
    proxy: FaultProxy | None = None
    collectors: dict[str, CollectorProcess] = field(default_factory=dict)
    skews: dict[str, float] = field(default_factory=dict)
    reconciler: ProcessInfo | None = None
    rollups: dict[str, ProcessInfo] = field(default_factory=dict)
    extra_proxies: list[FaultProxy] = field(default_factory=list)
    events: list[dict[str, object]] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)
    collector_settings: dict[str, str] = field(default_factory=dict)
    """``LM_*`` settings every collector started from now on gets (``--bundles``' own)."""

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self, *, proxy_max_hold_s: float | None = None) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # From this (the main) thread: then it is also told to stop if we die.
        self.ministack = start_ministack(self.work_dir / "ministack")
        self.bucket = f"lm-chaos-{self.seed % 10**9:09d}-{os.getpid() % 100000:05d}"
        await asyncio.to_thread(self.ministack.create_bucket, self.bucket)
        self.proxy = FaultProxy(
            upstream=self.ministack.endpoint_url,
            seed=self.seed,
            bucket=self.bucket,
            prefix=STORE_PREFIX,
            max_hold_s=proxy_max_hold_s or 3 * self.timing.read_timeout_s,
        )
        await self.proxy.start()

    async def stop(self) -> None:
        """Stop everything still running, by PID, in reverse order of need."""
        for name in list(self.rollups):
            await asyncio.to_thread(terminate, self.rollups.pop(name), 10.0)
        if self.reconciler is not None:
            await asyncio.to_thread(terminate, self.reconciler, 10.0)
            self.reconciler = None
        for name in list(self.collectors):
            await asyncio.to_thread(self.collectors.pop(name).stop, 15.0)
        for proxy in self.extra_proxies:
            await proxy.stop()
        if self.proxy is not None:
            await self.proxy.stop()
        if self.ministack is not None:
            await asyncio.to_thread(self.ministack.stop)

    def event(self, kind: str, **detail: object) -> None:
        entry = {"t": round(time.monotonic() - self.started_at, 3), "event": kind, **detail}
        self.events.append(entry)
        log.info("chaos_event", **{k: v for k, v in entry.items() if k != "event"}, kind=kind)

    # --- settings of every child --------------------------------------------------------

    @property
    def store_url(self) -> str:
        return f"s3://{self.bucket}/{STORE_PREFIX}"

    def env(self, **extra: str) -> dict[str, str]:
        assert self.proxy is not None
        t = self.timing
        settings = {
            "LM_STORE__URL": self.store_url,
            "LM_STORE__ENDPOINT_URL": self.proxy.url,
            "LM_STORE__CONNECT_TIMEOUT_S": str(t.connect_timeout_s),
            "LM_STORE__READ_TIMEOUT_S": str(t.read_timeout_s),
            "LM_INGEST__REQUEST_BUDGET_S": str(t.request_budget_s),
            "LM_GC__MARK_GRACE_S": str(t.mark_grace_s),
            "LM_GC__RETRY_HORIZON_S": str(t.retry_horizon_s),
            "LM_GC__MAX_DELETE_FRACTION": "1.0",
            "LM_GC__DELETE_EXPIRY_S": str(t.delete_expiry_s),
            "LM_STORE__MAX_CLOCK_SKEW_S": str(t.max_clock_skew_s),
            "LM_RECONCILER__LEASE_TTL_S": str(t.lease_ttl_s),
            "LM_RECONCILER__LOOP_INTERVAL_S": str(t.loop_interval_s),
            "LM_RECONCILER__VERIFY_RATE_PER_S": "5000",
            "LM_RECONCILER__MAX_AUDIT_INTERVAL_S": str(t.max_audit_interval_s),
            "LM_RECONCILER__CATALOG_GRACE_S": str(t.catalog_grace_s),
            "LM_ROLLUP__OWNER_LEASE_TTL_S": str(t.rollup_lease_ttl_s),
            "LM_ROLLUP__SPARK_MASTER": "local[1,4]",  # failed tasks retried, as by default
            "LM_METRICS__ENABLED": "false",
            "LM_LOGGING__FORMAT": "json",
            "LM_LOGGING__LEVEL": "warning",
        }
        settings.update(extra)
        return child_env(settings)

    def direct_store(self) -> ObjectStore:
        """The bucket without the proxy (never faulted): for setup writes and the audit."""
        assert self.ministack is not None
        return open_store(
            self.store_url,
            endpoint_url=self.ministack.endpoint_url,
            connect_timeout_s=5.0,
            read_timeout_s=30.0,
            credentials=CREDENTIALS,
        )

    # --- collectors -----------------------------------------------------------------------

    @property
    def collector_urls(self) -> list[str]:
        return [c.url for c in self.collectors.values()]

    async def start_collector(
        self, name: str, *, skew_s: float | None = None, port: int = 0
    ) -> CollectorProcess:
        """Start (or restart, on ``port``) collector ``name``; its skew is remembered."""
        if skew_s is not None:
            self.skews[name] = skew_s
        skew = self.skews.get(name, 0.0)
        env = self.env(
            LM_INGEST__COLLECTOR_ID=name,
            LM_HTTP__PORT=str(port),
            **self.collector_settings,
            **{SKEW_ENV: str(skew)},
        )
        logs = self.work_dir / "logs"
        # The start-up probe needs the store, which may be faulted or cut off: retry for
        # a bounded while.
        deadline = time.monotonic() + 60.0
        while True:
            try:
                process = await asyncio.to_thread(launch_collector, logs, name, env, skew)
                break
            except LaunchError as exc:
                if time.monotonic() > deadline:
                    raise
                log.warning("chaos_collector_start_failed", name=name, error=str(exc)[-300:])
                await asyncio.sleep(1.0)
        self.collectors[name] = process
        self.event("collector_started", name=name, pid=process.pid, skew_s=skew)
        return process

    async def kill_collector(self, name: str) -> None:
        process = self.collectors.pop(name)
        await asyncio.to_thread(process.kill)
        self.event("collector_killed", name=name, pid=process.pid)

    async def stop_collectors(self) -> None:
        """SIGTERM: each flushes its index log buffer, then exits."""
        stopping = {name: self.collectors.pop(name) for name in sorted(self.collectors)}
        codes = await asyncio.gather(
            *(asyncio.to_thread(process.stop, 20.0) for process in stopping.values())
        )
        for name, code in zip(stopping, codes, strict=True):
            self.event("collector_stopped", name=name, exit_code=code)

    # --- reconciler ---------------------------------------------------------------------

    async def start_reconciler(self, *, gc: bool) -> None:
        env = self.env(LM_GC__ENABLED="true" if gc else "false", LM_LOGGING__LEVEL="info")
        self.reconciler = self._spawn("reconciler", ["-m", "reconciler", "run"], env)
        self.event("reconciler_started", pid=self.reconciler.pid, gc=gc)

    async def kill_reconciler(self) -> None:
        if self.reconciler is not None:
            info, self.reconciler = self.reconciler, None
            await asyncio.to_thread(kill, info.process)
            self.event("reconciler_killed", pid=info.pid)

    async def stop_reconciler(self) -> int | None:
        """SIGTERM the daemon. Returns its exit code if it had already exited on its own
        (it should run until told to stop), else None."""
        if self.reconciler is None:
            return None
        info, self.reconciler = self.reconciler, None
        died = info.process.poll()
        code = await asyncio.to_thread(terminate, info, 15.0)
        self.event("reconciler_stopped", exit_code=code, exited_on_its_own=died is not None)
        return died

    async def reconciler_command(
        self, *args: str, direct: bool, timeout_s: float = 300.0
    ) -> tuple[int, str]:
        """A one-shot ``lm-reconciler`` command; ``direct`` bypasses the proxy."""
        extra = {"LM_GC__ENABLED": "false"}
        if direct:
            assert self.ministack is not None
            extra["LM_STORE__ENDPOINT_URL"] = self.ministack.endpoint_url
        env = self.env(**extra)
        return await self._run_to_end(["-m", "reconciler", *args], env, timeout_s)

    # --- rollup ---------------------------------------------------------------------------

    async def rollup_command(self, *args: str, timeout_s: float = 120.0) -> tuple[int, str]:
        """A one-shot ``lm-rollup`` command (``delete``, ``compact``) through the proxy."""
        self.event("rollup_command", command=args[0])
        return await self._run_to_end(["-m", "rollup", *args], self.env(), timeout_s)

    async def private_proxy(self) -> FaultProxy:
        """Another proxy to the same store, with the main proxy's seed and phase, for one
        process (so a trigger on it concerns that process alone). Stopped with the run."""
        assert self.ministack is not None and self.proxy is not None
        proxy = FaultProxy(
            upstream=self.ministack.endpoint_url,
            seed=self.seed,
            bucket=self.bucket,
            prefix=STORE_PREFIX,
            phase=self.proxy.phase,
            max_hold_s=self.proxy.max_hold_s,
        )
        await proxy.start()
        self.extra_proxies.append(proxy)
        return proxy

    def fault_counters(self) -> dict[str, object]:
        """The main proxy's counters, with every private proxy's added in."""
        assert self.proxy is not None
        merged: dict[str, object] = self.proxy.counters()
        for proxy in self.extra_proxies:
            for name in ("requests", "injected", "injected_by_op"):
                into = merged[name]
                assert isinstance(into, dict)
                other = proxy.counters()[name]
                assert isinstance(other, dict)
                for key, value in other.items():
                    into[key] = into.get(key, 0) + value
        return merged

    def start_rollup(
        self,
        name: str,
        *,
        direct: bool = False,
        endpoint_url: str | None = None,
        settings: dict[str, str] | None = None,
    ) -> ProcessInfo:
        extra = dict(settings or {})
        if direct:
            assert self.ministack is not None
            extra["LM_STORE__ENDPOINT_URL"] = self.ministack.endpoint_url
        elif endpoint_url is not None:
            extra["LM_STORE__ENDPOINT_URL"] = endpoint_url
        tmp = self.work_dir / "spark-tmp" / name
        tmp.mkdir(parents=True, exist_ok=True)
        extra["TMPDIR"] = str(tmp)
        info = self._spawn(name, ["-m", "rollup", "run"], self.env(**extra))
        self.rollups[name] = info
        self.event("rollup_started", name=name, pid=info.pid)
        return info

    async def wait_rollup(self, name: str, timeout_s: float) -> int | None:
        info = self.rollups[name]
        try:
            code = await asyncio.to_thread(info.process.wait, timeout_s)
        except subprocess.TimeoutExpired:
            code = await asyncio.to_thread(terminate, info, 10.0)
            self.event("rollup_timed_out", name=name)
        self.rollups.pop(name, None)
        self.event("rollup_finished", name=name, exit_code=code)
        shutil.rmtree(self.work_dir / "spark-tmp" / name, ignore_errors=True)
        return code

    def signal_rollup(self, name: str, signum: int) -> bool:
        """Send ``signum`` (SIGSTOP/SIGCONT: a paused owner) to run ``name``'s group."""
        info = self.rollups.get(name)
        if info is None or info.process.poll() is not None:
            return False
        signal_group(info.process, signum)
        self.event("rollup_signalled", name=name, signal=signal.Signals(signum).name)
        return True

    async def kill_rollup(self, name: str) -> None:
        info = self.rollups.get(name)
        if info is not None and info.process.poll() is None:
            await asyncio.to_thread(kill_group, info.process)
            self.event("rollup_killed", name=name, pid=info.pid)

    # --- children -------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> ProcessInfo:
        return spawn_python(self.work_dir / "logs", name, args, env)

    async def _run_to_end(
        self, args: list[str], env: dict[str, str], timeout_s: float
    ) -> tuple[int, str]:
        info = self._spawn(f"cmd-{args[1]}-{args[2]}-{int(time.monotonic() * 1000)}", args, env)
        try:
            code = await asyncio.to_thread(info.process.wait, timeout_s)
        except subprocess.TimeoutExpired:
            code = await asyncio.to_thread(terminate, info, 10.0)
        return code, info.log_path.read_text(errors="replace")[-4000:]
