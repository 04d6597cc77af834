"""The HTTP baseline of `bench.ingest`: the least an HTTP ingest service can do per batch.

    python -m bench.http_baseline --store-url s3://bucket/prefix --endpoint-url URL \\
        --ready-file PATH
    python -m bench.http_baseline --store-url file:///dir --ready-file PATH

A minimal aiohttp server (on uvloop, like the collector) with one route, ``POST
/v1/batches``: it reads the body, hashes it (the blob key is content-addressed), reads the
batch identity from the frame's fixed header **without any check** (no CRC, no payload
decode, no authentication, no caps, no metrics, no logging), then makes the collector's two
acknowledgement-path writes one after the other:

1. the body at ``raw-blobs/v1/sha256/<hash>`` with If-None-Match;
2. the accepted manifest JSON (the same record the collector writes) with If-None-Match;

and answers 200 with a small JSON body (409/503 on a refusal). On S3 the writes go through
aiobotocore with the collector's client settings (pool of 64, one attempt per call, path
addressing, no ``Expect: 100-continue``). On ``file://`` each write is an
``O_CREAT | O_EXCL`` file, fsync'd with its directory (the same durability as the
collector's fs store, without its temporary file and ``link``).

With ``--check-frames`` it first checks each frame as PROTOCOL §2 requires of a collector,
with the collector's own code and threads (`collector.frame_checks.FrameChecker`, as many
threads as ``http.decode_threads``' default): the CRC and header, then the payload and the
SHA-256, answering 400 on a `FrameError`. No authentication, caps, metrics or logging
still: the cheapest peer that honours the frame rules, to tell the checks' share of the
collector's CPU from the rest.

Not a product: it exists so the collector's cost is measured against a fair peer that pays
the same HTTP, hashing and store-client costs. Listens on 127.0.0.1 only; writes
``{"pid", "port"}`` to ``--ready-file`` once listening; stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import signal
import struct
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from collector.frame_checks import FrameChecker
from config import HttpSettings, IngestSettings
from protocol import keys, records
from protocol.batch_api import BATCHES_PATH
from protocol.frame import FrameError

# The frame's fixed header (PROTOCOL §1), read without any check.
_HEADER = struct.Struct(">4sBBH16sQQIII")
_HEADER_LEN = 52
MAX_BODY_BYTES = 8 * 1024 * 1024
# The collector's defaults, for --check-frames.
DECODE_THREADS = HttpSettings().decode_threads
MAX_RAW_BYTES = IngestSettings().max_raw_bytes


def identity_of(body: bytes) -> tuple[str, uuid.UUID, int, int, int]:
    """(agent_id, boot_id, seq_start, seq_end, record_count), trusting the header."""
    fields = _HEADER.unpack_from(body)
    agent_id_len, boot, seq_start, seq_end, count = fields[3], fields[4], *fields[5:8]
    agent_id = body[_HEADER_LEN : _HEADER_LEN + agent_id_len].decode("utf-8", "replace")
    return agent_id, uuid.UUID(bytes=boot), seq_start, seq_end, count


def manifest_of(body: bytes, sha: str) -> tuple[str, bytes]:
    agent_id, boot_id, seq_start, seq_end, count = identity_of(body)
    manifest = records.AcceptedManifest(
        agent_id=agent_id,
        boot_id=str(boot_id),
        seq_start=seq_start,
        seq_end=seq_end,
        record_count=count,
        frame_sha256=sha,
        frame_bytes=len(body),
        raw_blob_key=keys.raw_blob_key(sha),
        accepted_at_unix_ns=time.time_ns(),
        collector_id="bench-http-baseline",
    )
    return manifest.manifest_key, manifest.to_json()


class Exists(Exception):
    """The key was already there (412 / EEXIST)."""


class S3Writer:
    def __init__(self, url: str, endpoint_url: str, region: str) -> None:
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        self._bucket = bucket
        self._root = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._endpoint_url = endpoint_url
        self._region = region
        self._stack = contextlib.AsyncExitStack()
        self._s3: Any = None

    async def open(self) -> None:
        from aiobotocore.config import AioConfig
        from aiobotocore.session import AioSession
        from botocore import handlers

        config = AioConfig(
            region_name=self._region,
            max_pool_connections=64,  # the collector's default store pool
            connect_timeout=3.0,
            read_timeout=20.0,
            retries={"total_max_attempts": 1, "mode": "standard"},
            s3={"addressing_style": "path"},
            signature_version="s3v4",
        )
        self._s3 = await self._stack.enter_async_context(
            AioSession().create_client(
                "s3", endpoint_url=self._endpoint_url, region_name=self._region, config=config
            )
        )
        # As the collector's store does: the body goes with the headers, no 100-continue.
        self._s3.meta.events.unregister("before-call.s3", handlers.add_expect_header)

    async def close(self) -> None:
        await self._stack.aclose()

    async def create(self, key: str, body: bytes) -> None:
        from botocore.exceptions import ClientError

        try:
            await self._s3.put_object(
                Bucket=self._bucket, Key=self._root + key, Body=body, IfNoneMatch="*"
            )
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412:
                raise Exists(key) from None
            raise


class FileWriter:
    def __init__(self, url: str) -> None:
        self._root = Path(url.removeprefix("file://"))
        self._dirs: set[Path] = set()

    async def open(self) -> None:
        self._root.mkdir(parents=True, exist_ok=True)

    async def close(self) -> None:
        return None

    async def create(self, key: str, body: bytes) -> None:
        await asyncio.to_thread(self._create, self._root / key, body)

    def _create(self, path: Path, body: bytes) -> None:
        if path.parent not in self._dirs:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._dirs.add(path.parent)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise Exists(str(path)) from None
        try:
            os.write(fd, body)
            os.fsync(fd)
        finally:
            os.close(fd)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def build_app(
    writer: S3Writer | FileWriter, checker: FrameChecker | None = None
) -> web.Application:
    async def frame_sha256(body: bytes) -> str:
        """The frame's SHA-256; with ``checker``, after every check of the frame."""
        if checker is None:
            return hashlib.sha256(body).hexdigest()
        header = await checker.header(body)
        async with checker.payload_slot():
            sha, _ts_range = await checker.payload_sha256(body, header, MAX_RAW_BYTES)
        return sha

    async def post_batch(request: web.Request) -> web.Response:
        body = await request.read()
        try:
            sha = await frame_sha256(body)
        except FrameError as exc:
            return web.json_response({"error": "invalid_frame", "detail": str(exc)}, status=400)
        try:
            await writer.create(keys.raw_blob_key(sha), body)
        except Exists:
            pass  # a re-sent frame: the blob is there (this baseline does no GC checks)
        except Exception as exc:
            return web.json_response({"error": "store_unavailable", "detail": str(exc)}, status=503)
        manifest_key, manifest = manifest_of(body, sha)
        try:
            await writer.create(manifest_key, manifest)
        except Exists:
            return web.json_response({"error": "identity_conflict"}, status=409)
        except Exception as exc:
            return web.json_response({"error": "store_unavailable", "detail": str(exc)}, status=503)
        return web.json_response({"accepted": True, "duplicate": False, "frame_sha256": sha})

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post(BATCHES_PATH, post_batch)
    return app


async def serve(args: argparse.Namespace) -> None:
    if args.store_url.startswith("s3://"):
        writer: S3Writer | FileWriter = S3Writer(args.store_url, args.endpoint_url, args.region)
    else:
        writer = FileWriter(args.store_url)
    await writer.open()
    checker = FrameChecker(threads=DECODE_THREADS) if args.check_frames else None
    runner = web.AppRunner(build_app(writer, checker), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=args.backlog)
    await site.start()
    port = runner.addresses[0][1]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    _write_ready(Path(args.ready_file), port)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await writer.close()
        if checker is not None:
            checker.close()


def _write_ready(path: Path, port: int) -> None:
    path.write_text(json.dumps({"pid": os.getpid(), "port": port}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.http_baseline", description=__doc__)
    parser.add_argument("--store-url", required=True, help="s3://bucket/prefix or file:///dir")
    parser.add_argument("--endpoint-url", help="S3 endpoint (required for s3://)")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--backlog", type=int, default=256, help="as the collector: its in-flight cap"
    )
    parser.add_argument("--ready-file", required=True)
    parser.add_argument(
        "--check-frames",
        action="store_true",
        help="check each frame as the collector does (PROTOCOL §2) before writing it",
    )
    args = parser.parse_args(argv)
    import uvloop

    uvloop.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
