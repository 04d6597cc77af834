"""`bench.http_baseline`: the plain baseline writes any body whose fixed header it can read;
with ``--check-frames`` (the collector's `FrameChecker`) it refuses an invalid frame with
400 and writes nothing, and still writes a valid one with its two PUTs."""

from __future__ import annotations

import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from bench.http_baseline import FileWriter, build_app
from collector.frame_checks import FrameChecker
from protocol.batch_api import BATCHES_PATH
from protocol.frame_encode import encode_frame, points_table


def valid_frame() -> bytes:
    points = points_table([1_700_000_000_000_000_000], ["up"], [1.0], [{"job": "bench"}])
    return encode_frame(
        agent_id="agent-1", boot_id=uuid.uuid4(), seq_start=0, points=points, compress=False
    )


def payload_spoiled(frame: bytes) -> bytes:
    """The frame with its payload's last bytes overwritten and its CRC made right again:
    the header still reads, the payload check fails."""
    body = frame[:-12] + b"\xff" * 8
    return body + zlib.crc32(body).to_bytes(4, "big")


Send = Callable[[bytes], Awaitable[tuple[int, dict[str, object]]]]


def stored(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.fixture
async def post(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Send]:
    checker = FrameChecker(threads=1) if request.param else None
    writer = FileWriter(f"file://{tmp_path / 'store'}")
    await writer.open()
    server = TestServer(build_app(writer, checker), host="127.0.0.1")
    await server.start_server()

    async def send(body: bytes) -> tuple[int, dict[str, object]]:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{server.port}{BATCHES_PATH}"
            async with session.post(url, data=body) as answer:
                return answer.status, await answer.json()

    try:
        yield send
    finally:
        await server.close()
        if checker is not None:
            checker.close()


@pytest.mark.parametrize("post", [True], indirect=True)
async def test_checking_baseline_refuses_a_bad_payload_and_writes_nothing(
    post: Send, tmp_path: Path
) -> None:
    status, answer = await post(payload_spoiled(valid_frame()))
    assert status == 400
    assert answer["error"] == "invalid_frame"
    assert "payload" in str(answer["detail"])
    assert stored(tmp_path / "store") == []

    status, answer = await post(valid_frame())
    assert status == 200 and answer["accepted"] is True
    written = stored(tmp_path / "store")
    assert len(written) == 2  # the frame blob and its manifest
    assert any(name.startswith("raw-blobs/") for name in written)


@pytest.mark.parametrize("post", [False], indirect=True)
async def test_plain_baseline_checks_nothing(post: Send, tmp_path: Path) -> None:
    status, answer = await post(payload_spoiled(valid_frame()))
    assert status == 200 and answer["accepted"] is True
    assert len(stored(tmp_path / "store")) == 2
