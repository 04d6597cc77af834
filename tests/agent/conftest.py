from __future__ import annotations

import random
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from agent.producer import BatchProducer
from agent.spool import Spool
from protocol.frame_encode import points_table


def make_points(
    n: int, *, offset: float = 0.0, start_ns: int = 1_760_000_000_000_000_000
) -> pa.Table:
    return points_table(
        [start_ns + i for i in range(n)],
        ["cpu_usage_percent"] * n,
        [float(i) + offset for i in range(n)],
        [{"host": "h1", "region": "eu-west-1"}] * n,
    )


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    opened = Spool.open(tmp_path / "spool")
    yield opened
    opened.close()


@pytest.fixture
def producer(spool: Spool) -> BatchProducer:
    return BatchProducer(agent_id="agent-test", spool=spool, boot_id=uuid.UUID(int=7))


@pytest.fixture
def rng() -> random.Random:
    return random.Random(1234)
