"""Shared by the receiver tests: an in-process collector, the stores the collector
processes run on (fs, MiniStack), and reading back what was accepted (manifests,
their frames, their points)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from collector.intake import HttpLimits
from config import Principal, ReceiverSettings, TokenTable, hash_token
from protocol import keys, records
from protocol.frame import decode_frame
from store.base import ObjectStore
from store.open import open_store
from tests.collector import inprocess
from tests.collector.inprocess import InProcessCollector
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


def in_process_collector(
    *,
    limits: HttpLimits = LIMITS,
    receivers: ReceiverSettings | None = None,
    budget_s: float = 2.0,
    spool_dir: Path | None = None,
    store_clock: Any = None,
) -> AbstractAsyncContextManager[InProcessCollector]:
    """`tests.collector.inprocess.in_process_collector` with the receiver tests' tokens
    and limits."""
    return inprocess.in_process_collector(
        tokens=TOKENS,
        limits=limits,
        receivers=receivers,
        budget_s=budget_s,
        spool_dir=spool_dir,
        store_clock=store_clock,
    )


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
