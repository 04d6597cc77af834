"""The collector's HTTP app served in the test's own process (a helper, not tests).

`in_process_collector` assembles the app from the same parts `collector.server.Worker`
wires together, serves it like the worker (``auto_decompress=False``, `GuardedTCPSite`)
on 127.0.0.1, over a `MemoryStore` behind a `FaultyStore` so store failures can be
scripted. Real HTTP, one process: monkeypatches and log capture reach the server. The
one in-process collector of the tests: the receiver tests (`tests.collector.
receiver_fixtures`) use it with their own tokens, limits, receiver settings and spool.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from chaos.faulty_store import FaultyStore
from collector.accept import BatchAcceptor
from collector.app import CollectorApp
from collector.auth import Authenticator
from collector.bundles.options import BundleOptions
from collector.connections import GuardedTCPSite
from collector.intake import HttpLimits
from collector.local_spool.spool import LocalSpool
from collector.metrics import CollectorMetrics
from collector.promql.read_endpoint import ReadEndpoint
from collector.readiness import Readiness
from config import Principal, ReceiverSettings, TokenTable, hash_token
from index.log_writer import IndexLogWriter
from protocol.clock import Clock, SystemClock
from store.memory import MemoryStore
from store.retry import Backoff

WRITER_TOKEN = "inproc-writer-token"
ADMIN_TOKEN = "inproc-admin-token"
TOKENS = TokenTable(
    [
        Principal(name="writer", token_sha256=hash_token(WRITER_TOKEN), agents=("agent-*",)),
        Principal(name="ops", token_sha256=hash_token(ADMIN_TOKEN), admin=True),
    ]
)
# The in-flight byte cap is set above any payload_raw_len (u32) a fuzzed header can claim,
# so the fuzz oracle stays strict; the cap has tests of its own (test_app_inprocess.py).
LIMITS = HttpLimits(
    max_frame_bytes=64 * 1024,
    max_raw_bytes=1024 * 1024,
    max_in_flight_bytes=2**33,
    read_timeout_s=5.0,
)


@dataclass
class InProcessCollector:
    memory: MemoryStore
    store: FaultyStore
    app: CollectorApp
    readiness: Readiness
    base_url: str
    port: int


@asynccontextmanager
async def in_process_collector(
    *,
    tokens: TokenTable | None = TOKENS,
    limits: HttpLimits = LIMITS,
    budget_s: float = 2.0,
    readiness_clock: Clock | None = None,
    receivers: ReceiverSettings | None = None,
    spool_dir: Path | None = None,
    remote_read: ReadEndpoint | None = None,
    bundles: BundleOptions | None = None,
    memory: MemoryStore | None = None,
    store_clock: Any = None,
) -> AsyncIterator[InProcessCollector]:
    """The app over a fresh memory store, or ``memory`` (``spool_dir``: in ``local_spool``
    mode, acknowledging from a `LocalSpool` there; ``remote_read``: serving ``POST
    /api/v1/read`` with it; ``bundles``: group commit, PROTOCOL §3.10; ``store_clock``:
    this host's clock against the store's, `store.time.StoreClock` or a stand-in)."""
    memory = memory if memory is not None else MemoryStore()
    store = FaultyStore(memory, seed=1)
    clock = SystemClock()
    index_log = IndexLogWriter(store=store, clock=clock, rng=random.Random(2), writer_id="inproc")
    metrics = CollectorMetrics()
    acceptor = BatchAcceptor(
        store=store,
        collector_id="inproc",
        clock=clock,
        rng=random.Random(3),
        index_log=index_log,
        budget_s=budget_s,
        backoff=Backoff(attempts=50, base_s=0.01, cap_s=0.05),
        observe_store_op=metrics.observe_store_op,
        bundles=bundles,
        store_clock=store_clock,
    )
    readiness = Readiness(store=store, clock=readiness_clock or clock)
    readiness.probe_passed = True
    app = CollectorApp(
        acceptor=acceptor,
        authenticator=Authenticator(tokens),
        store=store,
        metrics=metrics,
        readiness=readiness,
        limits=limits,
        collector_id="inproc",
        receivers=receivers,
        remote_read=remote_read,
        spool=(
            LocalSpool(  # as collector.local_spool.setup builds it
                spool_dir,
                max_pending_bytes=1 << 30,
                retry_horizon_s=3600.0,
                max_landed=1000,
                refuse_new=acceptor.refuse_if_clock_skewed,
            )
            if spool_dir
            else None
        ),
    )
    index_log.start()
    # As collector.server.Worker.run builds it.
    runner = web.AppRunner(
        app.build(), access_log=None, handle_signals=False, auto_decompress=False
    )
    try:
        await runner.setup()
        await GuardedTCPSite(runner, "127.0.0.1", 0, guard=app.connection_guard).start()
        port = int(runner.addresses[0][1])
        yield InProcessCollector(memory, store, app, readiness, f"http://127.0.0.1:{port}", port)
    finally:
        await runner.cleanup()
        await index_log.stop(5.0)
