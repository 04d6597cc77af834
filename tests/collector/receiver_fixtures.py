"""Shared by the receiver tests: an in-process collector, the stores the collector
processes run on (fs, MiniStack), and reading back what was accepted (manifests,
their frames, their points)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from aiohttp import web

from chaos.faulty_store import FaultyStore
from collector.accept import BatchAcceptor
from collector.app import CollectorApp
from collector.auth import Authenticator
from collector.intake import HttpLimits
from collector.metrics import CollectorMetrics
from collector.readiness import Readiness
from collector.spool import LocalSpool
from config import Principal, ReceiverSettings, TokenTable, hash_token
from index.log_writer import IndexLogWriter
from protocol import keys, records
from protocol.clock import SystemClock
from protocol.frame import decode_frame
from store.base import ObjectStore
from store.memory import MemoryStore
from store.open import open_store
from store.retry import Backoff
from tests.s3_servers import RunningServer, fresh_bucket

WRITER_TOKEN = "receiver-writer-token"  # principal "prom-a": agents prom-*, otel-*
OTHER_TOKEN = "receiver-other-token"  # principal "other": agents other-*
TOKENS = TokenTable(
    [
        Principal(
            name="prom-a", token_sha256=hash_token(WRITER_TOKEN), agents=("prom-*", "otel-*")
        ),
        Principal(name="other", token_sha256=hash_token(OTHER_TOKEN), agents=("other-*",)),
    ]
)
TOKENS_TOML = "".join(
    f'[[principal]]\nname = "{p.name}"\ntoken_sha256 = "{p.token_sha256}"\n'
    f"agents = {list(p.agents)!r}\nadmin = false\n\n".replace("'", '"')
    for p in TOKENS.principals
)
LIMITS = HttpLimits(
    max_frame_bytes=256 * 1024, max_raw_bytes=1024 * 1024, read_timeout_s=5.0, retry_after_s=2
)


@dataclass
class InProcess:
    memory: MemoryStore
    store: FaultyStore
    app: CollectorApp
    base_url: str


@asynccontextmanager
async def in_process_collector(
    *,
    limits: HttpLimits = LIMITS,
    receivers: ReceiverSettings | None = None,
    budget_s: float = 2.0,
    spool_dir: Path | None = None,
) -> AsyncIterator[InProcess]:
    """The collector's app over a memory store behind a `FaultyStore`, on 127.0.0.1
    (``spool_dir``: in ``local_spool`` mode, acknowledging from a `LocalSpool` there)."""
    memory = MemoryStore()
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
    )
    readiness = Readiness(store=store, clock=clock)
    readiness.probe_passed = True
    app = CollectorApp(
        acceptor=acceptor,
        authenticator=Authenticator(TOKENS),
        store=store,
        metrics=metrics,
        readiness=readiness,
        limits=limits,
        collector_id="inproc",
        receivers=receivers,
        spool=(
            LocalSpool(
                spool_dir, max_pending_bytes=1 << 30, retry_horizon_s=3600.0, max_landed=1000
            )
            if spool_dir
            else None
        ),
    )
    index_log.start()
    # As collector.server.Worker.run builds it: aiohttp must not inflate bodies itself.
    runner = web.AppRunner(
        app.build(), access_log=None, handle_signals=False, auto_decompress=False
    )
    try:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = int(runner.addresses[0][1])
        yield InProcess(memory, store, app, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
        await index_log.stop(5.0)


# --- stores for collector processes ---------------------------------------------------------


@pytest.fixture(name="receiver_store")
def receiver_store_fixture(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, dict[str, str]]]:
    """(store url, extra collector env) for the store kind named by the parameter."""
    if request.param == "fs":
        yield f"file://{tmp_path / 'store'}", {}
        return
    server: RunningServer = request.getfixturevalue("ministack_server")
    yield f"s3://{fresh_bucket(server)}/rx", {"LM_STORE__ENDPOINT_URL": server.endpoint_url}


STORE_KINDS = [
    pytest.param("fs", id="fs"),
    pytest.param("ministack", id="ministack", marks=pytest.mark.s3),
]


def open_test_store(url: str, env: dict[str, str]) -> ObjectStore:
    return open_store(url, endpoint_url=env.get("LM_STORE__ENDPOINT_URL"), region="us-east-1")


# --- what was accepted ---------------------------------------------------------------------


@dataclass(frozen=True)
class AcceptedBatch:
    manifest: records.AcceptedManifest
    points: list[dict[str, Any]]  # ts (ns), metric, value, labels (dict), seq


async def accepted_batches(store: ObjectStore) -> list[AcceptedBatch]:
    """Every accepted manifest with the points of its frame (read from its raw blob)."""
    batches = []
    async for info in store.list(keys.ACCEPTED_PREFIX):
        body, _ = await store.get(info.key)
        manifest = records.AcceptedManifest.from_json(body)
        frame, _ = await store.get(manifest.raw_blob_key)
        decoded = decode_frame(frame)
        table = decoded.points
        columns = zip(
            table.column("ts").cast(pa.int64()).to_pylist(),
            table.column("metric").to_pylist(),
            table.column("value").to_pylist(),
            table.column("labels").to_pylist(),
            strict=True,
        )
        points = [
            {
                "ts": ts,
                "metric": metric,
                "value": value,
                "labels": dict(labels or []),
                "seq": decoded.seq_start + index,
            }
            for index, (ts, metric, value, labels) in enumerate(columns)
        ]
        batches.append(AcceptedBatch(manifest, points))
    return batches
