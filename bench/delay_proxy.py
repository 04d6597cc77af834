"""A delay line in front of a store server (`start_delay_proxy`): a TCP proxy process that
holds every byte going to the server for ``delay_ms``, so each request's round trip grows
by that much, as it would against a distant S3. Used by the ingest, listing and raw
retention benchmarks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from bench._common import REPO_ROOT, stop_pid_process
from chaos.s3_server import CREDENTIALS, die_with_parent_hook, start_ministack
from store.base import ObjectStore
from store.open import open_store

LINE_CHUNKS = 64  # chunks (of up to 64 KiB) the delay line holds per direction


@dataclass
class DelayProxy:
    """A TCP proxy process that holds every byte going *to* the server ``delay_ms`` before
    forwarding it (answers pass at once): each request's round trip grows by
    ``delay_ms``, whatever the client. Both the collector and the baseline reach the
    store through it, so both pay the same latency per store request."""

    process: subprocess.Popen[bytes]
    port: int
    delay_ms: float

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        stop_pid_process(self.process)


def start_delay_proxy(
    *, upstream_port: int, delay_ms: float, work_dir: Path, timeout_s: float = 20.0
) -> DelayProxy:
    work_dir.mkdir(parents=True, exist_ok=True)
    ready = work_dir / f"delay-proxy-{upstream_port}-{delay_ms:g}.port"
    ready.unlink(missing_ok=True)
    log = (work_dir / "delay-proxy.log").open("ab")
    code = (
        "import sys; from bench.delay_proxy import delay_proxy_main; delay_proxy_main(sys.argv[1:])"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, str(upstream_port), str(delay_ms), str(ready)],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=die_with_parent_hook(),
    )
    log.close()
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            stop_pid_process(process)
            raise RuntimeError(f"delay proxy did not start; see {work_dir / 'delay-proxy.log'}")
        time.sleep(0.02)  # polling for readiness, bounded by the deadline
    return DelayProxy(process, int(ready.read_text()), delay_ms)


@dataclass(frozen=True)
class DelayedStores:
    """One fresh bucket on MiniStack, opened twice: ``direct`` (to plant a benchmark's
    data quickly) and ``delayed`` (through a delay proxy: what is measured)."""

    direct: ObjectStore
    delayed: ObjectStore


@contextlib.asynccontextmanager
async def delayed_ministack(
    work: Path, prefix: str, latency_ms: float
) -> AsyncIterator[DelayedStores]:
    """MiniStack and a delay proxy of ``latency_ms`` in front of it, under ``work``; both
    stopped by PID on exit, the stores closed."""
    ministack = start_ministack(work / "ministack")
    stores: list[ObjectStore] = []
    proxy = None
    try:
        bucket = f"lm-{prefix}-{os.getpid() % 100000:05d}"
        await asyncio.to_thread(ministack.create_bucket, bucket)
        proxy = start_delay_proxy(
            upstream_port=ministack.port, delay_ms=latency_ms, work_dir=work / "proxy"
        )
        for endpoint_url in (ministack.endpoint_url, proxy.endpoint_url):
            url = f"s3://{bucket}/{prefix}"
            stores.append(open_store(url, endpoint_url=endpoint_url, credentials=CREDENTIALS))
        yield DelayedStores(*stores)
    finally:
        for store in stores:
            await store.close()
        if proxy is not None:
            proxy.stop()
        ministack.stop()


def delay_proxy_main(argv: list[str]) -> None:
    """Entry point of the proxy process: ``UPSTREAM_PORT DELAY_MS READY_FILE``."""
    import uvloop

    upstream_port, delay_s, ready = int(argv[0]), float(argv[1]) / 1000.0, Path(argv[2])
    uvloop.run(_serve_delay_proxy(upstream_port, delay_s, ready))


async def _serve_delay_proxy(upstream_port: int, delay_s: float, ready: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    async def connection(
        client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(
            _pipe(client_reader, server_writer, delay_s),
            _pipe(server_reader, client_writer, 0.0),
            return_exceptions=True,
        )
        for writer in (client_writer, server_writer):
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0, limit=1 << 20)
    port = server.sockets[0].getsockname()[1]
    temporary = ready.with_suffix(".tmp")
    temporary.write_text(str(port))
    temporary.replace(ready)
    async with server:
        await stop.wait()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy until EOF; with a delay, each chunk leaves ``delay_s`` after it arrived, in
    order (a delay line, so a request's body is not delayed once per chunk)."""
    loop = asyncio.get_running_loop()
    if delay_s <= 0:
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()
        writer.write_eof()
        return
    # Bounded (64 chunks of up to 64 KiB in flight): a slow receiver makes the reader wait
    # instead of the proxy buffering a whole upload.
    line: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=LINE_CHUNKS)

    async def release() -> None:
        while True:
            due, chunk = await line.get()
            if not chunk:
                writer.write_eof()
                return
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()

    releaser = asyncio.create_task(release())

    async def enqueue(item: tuple[float, bytes]) -> None:
        """Put ``item`` on the line, or end if the releaser ended (its peer closed)."""
        putter = asyncio.ensure_future(line.put(item))
        await asyncio.wait({putter, releaser}, return_when=asyncio.FIRST_COMPLETED)
        if not putter.done():
            putter.cancel()
            await releaser  # raises the releaser's error

    try:
        while chunk := await reader.read(1 << 16):
            await enqueue((loop.time() + delay_s, chunk))
    finally:
        await enqueue((0.0, b""))
    await releaser
