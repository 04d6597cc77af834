"""Running collectors: one worker process, or N sharing a port with SO_REUSEPORT.

`serve()` checks what must hold before anything binds (tokens or a loopback address; the
acceptance mode; the conditional-write probe), then runs one worker in this process or
starts N worker processes and supervises them. A worker stops on SIGTERM/SIGINT: it
closes its listening socket, lets in-flight requests finish within ``http.shutdown_grace_s``,
flushes the index log buffer, and exits 0. The supervisor forwards the signal to each
worker by PID and, past the grace, kills what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import random
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import structlog
from aiohttp import web

from config import Settings, load_tokens
from index.features import BundleGate, FeatureRecordError, UnknownFeature
from index.log_writer import IndexLogWriter
from protocol import keys
from protocol.clock import SystemClock
from store.base import ObjectStore
from store.errors import StoreError
from store.open import open_store_from_settings
from store.time import store_clock
from store.timed import TimedStore

from .accept import BatchAcceptor, bundle_options
from .app import CollectorApp
from .auth import Authenticator
from .connections import GuardedTCPSite
from .intake import HttpLimits
from .local_spool.lander import SpoolLander
from .local_spool.setup import build_local_spool
from .local_spool.spool import LocalSpool
from .metrics import CollectorMetrics
from .probe import probe_for
from .process_memory import prepare_worker_process
from .query.setup import build_query
from .readiness import Readiness
from .startup_checks import StartupError as StartupError  # re-exported: callers import it here
from .startup_checks import check_startup as check_startup

log = structlog.get_logger("collector.server")
READ_BUFSIZE = 8 * 1024


async def run_probe(settings: Settings) -> None:
    store = open_store_from_settings(settings.store)
    try:
        result = await probe_for(store, settings)
        log.info("probe_passed", store=result.store_url, detail=result.detail)
    finally:
        await store.close()


@dataclass
class Worker:
    """One collector process's parts, assembled from settings."""

    settings: Settings
    index: int = 0
    probe_passed: bool = True

    def __post_init__(self) -> None:
        s = self.settings
        clock = SystemClock()
        rng = random.Random()
        self.metrics = CollectorMetrics()
        opened = open_store_from_settings(s.store, clock=clock)
        self.store: ObjectStore = TimedStore(opened, observe=self.metrics.store_latency.observe)
        store_time = store_clock(self.store, clock)  # skew against the store (§3.8)
        self.metrics.watch_store_clock(store_time)
        self.index_log = IndexLogWriter(
            store=self.store,
            clock=clock,
            rng=rng,
            writer_id=s.ingest.collector_id,
            flush_rows=min(s.ingest.index_flush_rows, s.ingest.index_buffer_rows),
            flush_max_age_s=s.ingest.index_flush_max_age_ms / 1000,
            max_buffered_rows=s.ingest.index_buffer_rows,
            on_event=lambda fate, rows: self.metrics.index_rows.labels(fate=fate).inc(rows),
            put_budget_s=s.ingest.index_put_budget_s,
            landing_s=s.store.connect_timeout_s + s.store.read_timeout_s,
            skewed=lambda: store_time.skewed,  # PROTOCOL §3.7: a skewed clock cuts nothing
        )
        # The store's feature record and this process's version entry (PROTOCOL §3.10):
        # named by the log writer id, so enable-bundles matches its segments to it.
        self.gate = BundleGate(
            self.store,
            clock,
            role="query-collector" if s.query.designated else "collector",
            process_id=keys.index_writer_id(s.ingest.collector_id),
            rng=rng,
        )
        tokens = load_tokens(s.auth.tokens_file) if s.auth.tokens_file else None
        authenticator = Authenticator(tokens)
        self.query = build_query(
            s, store=self.store, clock=store_time, metrics=self.metrics, authenticator=authenticator
        )
        self.acceptor = BatchAcceptor(
            store=self.store,
            collector_id=s.ingest.collector_id,
            clock=clock,
            rng=rng,
            index_log=self.index_log,
            budget_s=s.ingest.request_budget_s,
            observe_store_op=self.metrics.observe_store_op,
            store_clock=store_time,
            on_accepted=self.query.own.on_accepted if self.query.own is not None else None,
            max_concurrent=s.store.max_pool_connections,
            bundles=bundle_options(s, lambda: self.gate.bundles_enabled, self.metrics),
            max_frame_bytes=s.ingest.max_frame_bytes,
        )
        self.readiness = Readiness(
            store=self.store,
            clock=clock,
            on_answer=lambda: self.metrics.store_last_ok.set(time.time()),
            store_clock=store_time,
        )
        self.readiness.probe_passed = self.probe_passed
        self.spool: LocalSpool | None = None
        self.lander: SpoolLander | None = None
        if s.ingest.acceptance == "local_spool":
            self.spool, self.lander = build_local_spool(
                s, acceptor=self.acceptor, store=self.store, clock=clock
            )
        self.app = CollectorApp(
            acceptor=self.acceptor,
            authenticator=authenticator,
            store=self.store,
            metrics=self.metrics,
            readiness=self.readiness,
            limits=HttpLimits(
                max_frame_bytes=s.ingest.max_frame_bytes,
                max_raw_bytes=s.ingest.max_raw_bytes,
                max_in_flight_requests=s.http.max_in_flight_requests,
                max_in_flight_bytes=s.http.max_in_flight_bytes,
                read_timeout_s=s.http.read_timeout_s,
                max_connections=s.http.max_connections,
                decode_threads=s.http.decode_threads,
                max_bodies_held=s.store.max_pool_connections + s.http.decode_threads,
            ),
            collector_id=s.ingest.collector_id,
            worker_name=str(self.index),
            spool=self.spool,
            receivers=s.receivers,
            query=self.query.endpoint,
        )

    async def run(
        self, *, reuse_port: bool, ready_file: Path | None = None, metrics_port: int | None = None
    ) -> None:
        s = self.settings
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await self._start_gate()
        gate_task = asyncio.create_task(self.gate.run(), name="feature-gate")  # every minute
        self.index_log.start()
        readiness_task = asyncio.create_task(self.readiness.run(), name="readiness")
        lander_task = asyncio.create_task(self.lander.run(), name="lander") if self.lander else None
        follower = self.query.follower
        follow_task = asyncio.create_task(follower.run(), name="live-follow") if follower else None
        runner = web.AppRunner(
            self.app.build(),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=s.http.shutdown_grace_s,
            keepalive_timeout=s.http.keepalive_timeout_s,
            # Compression lives inside the frame; a Content-Encoding is answered 415 by the
            # app, so aiohttp must not try to decode bodies itself.
            auto_decompress=False,
            # aiohttp buffers up to twice this much of a body before it stops reading the
            # socket; the kernel holds the rest. With its default (64 KiB) a worker holds
            # every 64 KiB upload on its open connections whether it is admitted or not.
            read_bufsize=READ_BUFSIZE,
        )
        await runner.setup()
        # The accept backlog must hold a burst of new connections up to the in-flight cap.
        backlog = max(128, s.http.max_in_flight_requests)
        site = GuardedTCPSite(
            runner,
            s.http.host,
            s.http.port,
            guard=self.app.connection_guard,
            reuse_port=reuse_port,
            backlog=backlog,
        )
        await site.start()
        port = _bound_port(runner)
        await self.app.listening(s.http.host, port)  # the PromQL engine reads from this port
        metrics_runner = (
            await _start_metrics_site(self.app, s.metrics.host, metrics_port)
            if metrics_port
            else None
        )
        log.info(
            "collector_listening",
            url=f"http://{s.http.host}:{port}",
            worker=self.index,
            pid=os.getpid(),
        )
        if ready_file is not None:
            _write_ready_file(
                ready_file,
                {"host": s.http.host, "port": port, "pid": os.getpid(), "worker": self.index},
            )
        await stop.wait()
        log.info("collector_stopping", worker=self.index, grace_s=s.http.shutdown_grace_s)
        deadline = time.monotonic() + s.http.shutdown_grace_s
        await site.stop()  # stop listening; connections already open keep being served
        # Let requests in flight (including uploads still sending their body) finish: the
        # runner's cleanup marks connections closing, and aiohttp then drops further bytes.
        await self.app.wait_idle(max(0.0, deadline - time.monotonic()))
        await runner.cleanup()
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        readiness_task.cancel()
        gate_task.cancel()
        if follow_task is not None:
            follow_task.cancel()
        if lander_task is not None and self.lander is not None:
            lander_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lander_task  # an interrupted landing is repeated: the protocol is idempotent
            await self.lander.drain(max(1.0, deadline - time.monotonic()))
        if self.spool is not None:
            await self.spool.close()
        await self.index_log.stop(max(1.0, deadline - time.monotonic()))
        await self.store.close()
        stats = self.index_log.stats
        log.info(
            "collector_stopped",
            worker=self.index,
            index_rows_written=stats.rows_written,
            index_segments_written=stats.segments_written,
            index_rows_dropped=stats.dropped_full + stats.dropped_failed,
        )

    async def _start_gate(self) -> None:
        """Refuse to start on a feature this version lacks (exit 2); a store that does not
        answer now leaves bundles off until a heartbeat reads the record."""
        try:
            await self.gate.start()
        except (UnknownFeature, FeatureRecordError) as exc:
            raise StartupError(str(exc)) from None
        except StoreError as exc:
            log.warning("feature_gate_unavailable", error=str(exc))


def _bound_port(runner: web.AppRunner) -> int:
    for server_socket in runner.addresses:
        return int(server_socket[1])
    raise StartupError("the HTTP site did not bind")


async def _start_metrics_site(app: CollectorApp, host: str, port: int) -> web.AppRunner:
    metrics_app = web.Application()
    metrics_app.router.add_get("/metrics", app.metrics_text)
    runner = web.AppRunner(metrics_app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def _write_ready_file(path: Path, info: dict[str, object]) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(info))
    temporary.replace(path)


def worker_main(config_path: str | None, index: int, ready_file: str | None, workers: int) -> None:
    """Entry point of a worker process (spawned by the supervisor)."""
    from config import configure_logging, load_settings

    prepare_worker_process()
    settings = load_settings(Path(config_path) if config_path else None)
    configure_logging(settings.logging)
    structlog.contextvars.bind_contextvars(worker=index)
    metrics_port = (
        settings.metrics.port + index if settings.metrics.enabled and workers > 1 else None
    )
    worker_ready = Path(f"{ready_file}.{index}") if ready_file else None
    _run_event_loop(
        Worker(settings, index).run(
            reuse_port=True, ready_file=worker_ready, metrics_port=metrics_port
        )
    )


def _run_event_loop(main: object) -> None:
    import uvloop

    uvloop.run(main)  # type: ignore[arg-type]


def serve(
    settings: Settings, *, config_path: str | None, workers: int, ready_file: Path | None
) -> int:
    """Run the collector until stopped; returns the process exit code."""
    check_startup(settings, workers)
    prepare_worker_process()  # the supervisor serves itself with one worker
    if settings.ingest.probe_on_start:
        _run_event_loop(run_probe(settings))
    else:
        log.warning("probe_skipped", reason="ingest.probe_on_start = false")
    if workers == 1:
        _run_event_loop(Worker(settings).run(reuse_port=False, ready_file=ready_file))
        return 0
    return _supervise(settings, config_path, workers, ready_file)


def _supervise(
    settings: Settings, config_path: str | None, workers: int, ready_file: Path | None
) -> int:
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(
            target=worker_main,
            args=(config_path, index, str(ready_file) if ready_file else None, workers),
            name=f"lm-collector-worker-{index}",
        )
        for index in range(workers)
    ]
    _check_port_free_for_reuse(settings.http.host, settings.http.port)
    for process in processes:
        process.start()
    stopping = False

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for process in processes:
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    exit_code = 0
    # Watch every worker: one that dies takes the group down so the service manager
    # restarts it whole (a collector silently running on fewer workers helps nobody).
    while not stopping and all(process.is_alive() for process in processes):
        multiprocessing.connection.wait([process.sentinel for process in processes], timeout=1.0)
    if not stopping:
        dead = [p for p in processes if not p.is_alive()]
        for process in dead:
            log.error("worker_died", worker=process.name, exitcode=process.exitcode)
        exit_code = 1
        forward(signal.SIGTERM, None)
    deadline = time.monotonic() + settings.http.shutdown_grace_s + 5.0
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
        if process.is_alive() and process.pid is not None:
            log.error("worker_killed_after_grace", worker=process.name)
            os.kill(process.pid, signal.SIGKILL)
            process.join()
        elif process.exitcode not in (0, None) and exit_code == 0:
            exit_code = 1
    return exit_code


def _check_port_free_for_reuse(host: str, port: int) -> None:
    if port == 0:
        raise StartupError("--workers > 1 needs a fixed http.port (port 0 cannot be shared)")
    with socket.socket(
        socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM
    ) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise StartupError(f"cannot bind {host}:{port}: {exc}") from None
