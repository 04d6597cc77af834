"""Local spool mode lands what it acknowledged (PROTOCOL §3.4), black-box: a real
``lm-collector serve`` process, frames posted over HTTP, the store read afterwards.

Two frames of one identity, A answered 200 and B answered 409 naming A, are chosen so
that B's SHA-256 sorts before A's: a lander that takes the spool in file-name (hash)
order accepts B and quarantines A. Landing follows the acknowledgement order instead,
during the run and after a kill -9 and restart; and an identity already landed answers a
conflicting frame 409, also after a restart (the spool remembers what it landed).
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.launch import CollectorProcess, start_collector
from protocol import keys, records
from protocol.frame_encode import encode_frame, points_table
from store.errors import NotFound
from store.fs import FileSystemStore

BOOT = uuid.UUID("7d0c2a3e-5b1f-4e6a-8c9d-0123456789ab")
IDENTITY = keys.BatchIdentity("order-agent", BOOT, 1, 1)


def frame(value: float) -> bytes:
    points = points_table([1_763_719_200_000_000_000], ["m"], [value], [None])
    return encode_frame(agent_id=IDENTITY.agent_id, boot_id=BOOT, seq_start=1, points=points)


def sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def pair_whose_second_sorts_first() -> tuple[bytes, bytes]:
    """A, then B: same identity, different content, sha256(B) < sha256(A)."""
    first = frame(1.0)
    for step in range(2, 200):
        second = frame(float(step))
        if sha(second) < sha(first):
            return first, second
    raise AssertionError("no such pair among 200 values")  # each value: probability 1/2


def post(url: str, body: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        f"{url}/v1/batches", data=body, headers={"Content-Type": "application/x-lmbatch"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    yield {
        "LM_STORE__URL": f"file://{tmp_path / 'store'}",
        "LM_INGEST__ACCEPTANCE": "local_spool",
        "LM_INGEST__SPOOL_DIR": str(tmp_path / "spool"),
        # One landing round at start-up, the next in an hour: only a stop (SIGTERM drains
        # the spool) or a restart lands what the test posted.
        "LM_INGEST__OBJECT_LANDING_INTERVAL_MS": "3600000",
        "LM_METRICS__ENABLED": "false",
    }


def start(tmp_path: Path, name: str, env: dict[str, str]) -> CollectorProcess:
    return start_collector(work_dir=tmp_path / "logs", name=name, env=env)


def post_conflicting_pair(collector: CollectorProcess) -> tuple[bytes, bytes]:
    first, second = pair_whose_second_sorts_first()
    status, body = post(collector.url, first)
    assert (status, body["duplicate"], body["spooled"]) == (200, False, True)
    status, body = post(collector.url, second)
    assert status == 409, body
    assert body["accepted_frame_sha256"] == sha(first)
    assert body["quarantine_key"] == keys.quarantine_key(IDENTITY, sha(second))
    return first, second


async def assert_landed(store_dir: Path, accepted: bytes, refused: bytes) -> None:
    """The 200 frame is the accepted batch, the 409 frame is quarantined."""
    store = FileSystemStore(store_dir)
    manifest = records.AcceptedManifest.from_json(
        (await store.get(keys.accepted_manifest_key(IDENTITY)))[0]
    )
    assert manifest.frame_sha256 == sha(accepted)
    await store.head(keys.quarantine_key(IDENTITY, sha(refused)))
    with pytest.raises(NotFound):
        await store.head(keys.quarantine_key(IDENTITY, sha(accepted)))


async def test_the_frame_answered_200_lands_and_the_409_one_is_quarantined(
    tmp_path: Path, env: dict[str, str]
) -> None:
    collector = start(tmp_path, "order-1", env)
    try:
        accepted, refused = post_conflicting_pair(collector)
    finally:
        assert collector.stop() == 0  # SIGTERM: the last landing round, then exit
    await assert_landed(tmp_path / "store", accepted, refused)
    assert list((tmp_path / "spool" / "pending").iterdir()) == []


async def test_acknowledgement_order_survives_kill_9_and_restart(
    tmp_path: Path, env: dict[str, str]
) -> None:
    collector = start(tmp_path, "order-1", env)
    try:
        accepted, refused = post_conflicting_pair(collector)
    finally:
        collector.kill()  # by PID, before any landing round saw the frames
    assert not (tmp_path / "store" / "accepted").exists()
    restarted = start(tmp_path, "order-2", env)  # lands the spool in its first round
    assert restarted.stop() == 0
    await assert_landed(tmp_path / "store", accepted, refused)


async def test_a_landed_identity_answers_a_conflicting_frame_409_after_a_restart(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """Before: once a frame had landed the spool no longer knew it, so a conflicting
    frame was answered 200 and quarantined when landing, after the agent deleted it."""
    accepted, refused = pair_whose_second_sorts_first()
    collector = start(tmp_path, "landed-1", env)
    try:
        assert post(collector.url, accepted)[0] == 200
    finally:
        assert collector.stop() == 0  # lands it
    assert list((tmp_path / "spool" / "pending").iterdir()) == []
    restarted = start(tmp_path, "landed-2", env)
    try:
        status, body = post(restarted.url, refused)
        assert status == 409, body
        assert body["accepted_frame_sha256"] == sha(accepted)
        assert body["quarantine_key"] == keys.quarantine_key(IDENTITY, sha(refused))
        status, body = post(restarted.url, accepted)  # a retry of the landed frame
        assert (status, body["duplicate"]) == (200, True)
    finally:
        assert restarted.stop() == 0
    await assert_landed(tmp_path / "store", accepted, refused)
