"""The daemon's full audit in a child process: ``python -m reconciler.audit.worker``.

The daemon (`reconciler.audit.child`) starts this so that the audit's listing parses,
record reads and joins run on a core (and a GIL) of their own, beside the steady pass
(PROTOCOL §3.9: "a separate task (or process)"). Internal: started only by the daemon,
which speaks to it in JSON lines (`reconciler.audit.wire`).

Standard input, from the daemon: first the start document (the daemon's settings, its
lease as it holds it, and its catalog writer's position), then lease expiries as the
daemon renews, and the answers to catalog writes. Standard output, to the daemon:
progress, counter snapshots, catalog writes to make, the hours written, and at the end
the audit's record (or why it failed). Logs go to standard error, as the daemon's do.

**It holds no lease of its own.** It runs the audit on the configured engine
(`reconciler.audit.engines.spark_run.configured_audit`: with ``[reconciler] audit_engine =
"spark"`` this process is the Spark driver) under the daemon's epoch:
its fence (`BorrowedFence`) is valid while the expiry the daemon last sent lies ahead
(minus the fence's usual margin, in store time); the audit record's compare-and-swap
refuses a newer ``owner_epoch`` as it does in one process. Catalog files are created by
the daemon's own `CatalogWriter` (`RemoteCatalogWriter` sends the encoded file), so every
name of the epoch still comes from one sequence, in creation order, and the position the
audit records at its start (for the GC's rule 2) covers the steady pass's files too.

It runs at a lower CPU priority (`NICENESS`): on a busy host the scheduler gives the
steady pass (and everything else) the CPU first, and the audit what is left; it is the
one piece of work that may take long (it still completes at least every
``max_audit_interval_s`` unless the host has no spare CPU at all).

It ends when the daemon says so (SIGTERM: the audit finishes the item in hand and saves
its progress; the daemon SIGKILLs it after a grace), and by itself when its standard
input closes (the daemon is gone) or the daemon stops sending lease expiries: an audit
never outlives the term it runs under. The audit is resumable, so an end loses nothing.

Test hook: with ``LM_AUDIT_WORKER_HOLD`` naming a FIFO, the worker opens it and reads it
to its end before its first catalog write (a test holds a running audit back
deterministically: its record is created, its listing found records to catalog).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import structlog

from config import Settings, configure_logging
from index.catalog import CatalogWriter
from protocol import keys
from protocol.clock import Clock, SystemClock
from protocol.records import LeaseRecord
from reconciler.audit import wire
from reconciler.audit.engines.spark_run import configured_audit
from reconciler.audit.inventory import inventory_from_settings
from reconciler.audit.run import AuditProgress
from reconciler.context import Fence, ReconcilerContext
from reconciler.metrics import ReconcilerMetrics
from store import errors as store_errors
from store.base import ObjectStore
from store.lease import Lease, LeaseLost
from store.open import open_store_from_settings
from store.time import store_clock

HOLD_ENV = "LM_AUDIT_WORKER_HOLD"
NICENESS = 10
"""Added to the worker's nice value at its start (Linux: about a tenth of the CPU share of
a nice-0 process that wants the same core)."""
EXIT_OK, EXIT_FAILED, EXIT_ORPHANED = 0, 1, 3
log = structlog.get_logger("reconciler.audit.worker")


class BorrowedFence(Fence):
    """The daemon's lease, as the daemon last reported it: valid while its expiry lies
    more than ``margin_s`` ahead in store time. Never renews or releases anything."""

    def __init__(self, *, store: ObjectStore, clock: Clock, lease: Lease, ttl_s: float) -> None:
        super().__init__(store=store, clock=clock, lease=lease, ttl_s=ttl_s)

    def extend(self, expires_at_unix_ns: int) -> None:
        """The daemon renewed its lease (expiries only grow)."""
        record = self.lease.record
        if expires_at_unix_ns > record.expires_at_unix_ns:
            new = record.model_copy(update={"expires_at_unix_ns": expires_at_unix_ns})
            self._lease = replace(self.lease, record=new)

    def lose(self, detail: str) -> None:
        if self._lost is None:
            self._lost = LeaseLost(self.lease.key, self.epoch, detail)

    async def check(self, *, min_remaining_s: float = 0.0) -> None:
        """Valid with margin, as the daemon last reported; renewing is the daemon's (an
        audit worker records no lease expiry, so ``min_remaining_s`` asks nothing)."""
        if self._lost is not None:
            raise self._lost
        if not self.lease.is_valid(self._clock, self.margin_s):
            self.lose("the daemon stopped reporting renewals of its lease")
            assert self._lost is not None
            raise self._lost

    def start_renewing(self, rng: random.Random) -> None:
        return None

    async def release(self) -> bool:
        return False


class RemoteCatalogWriter(CatalogWriter):
    """Catalog files created by the daemon's writer: the encoded file goes up the pipe and
    the daemon answers with the key (and ETag) it created, or the error its writer
    raised. `position` is the daemon writer's position when it started this worker:
    every file either process creates after the audit's start is named from there on."""

    def __init__(self, channel: _Channel, *, position: str, epoch: int, clock: Clock) -> None:
        super().__init__(store=channel.store, clock=clock, rng=random.Random(), epoch=epoch)
        self._channel = channel
        self._position = position
        self._released: asyncio.Future[None] | None = None

    def position(self) -> str:
        return self._position

    async def create_encoded(
        self, hour: keys.UtcHour, body: bytes, *, writer: str
    ) -> tuple[str, str | None]:
        if self._released is None:  # every write waits for the one hold (they run at once)
            self._released = asyncio.ensure_future(_hold_if_asked())
        await asyncio.shield(self._released)
        answer = await self._channel.request(
            {"hour_ns": hour.start_ns, "body": base64.b64encode(body).decode(), "writer": writer}
        )
        if "error" in answer:
            raise _error(answer, self._epoch)
        self.files_written += 1
        return str(answer["key"]), answer.get("etag")


def _error(answer: dict[str, Any], epoch: int) -> Exception:
    name, message = str(answer["error"]), str(answer.get("message", ""))
    if name == "LeaseLost":
        return LeaseLost(keys.RECONCILER_LEASE_KEY, epoch, f"(the daemon) {message}")
    cls = getattr(store_errors, name, None)
    if isinstance(cls, type) and issubclass(cls, store_errors.StoreError):
        return cls("catalog_write", "", f"(the daemon) {message}")
    return store_errors.StoreError("catalog_write", "", f"(the daemon) {name}: {message}")


@dataclass(frozen=True, kw_only=True)
class _WorkerContext(ReconcilerContext):
    """The audit's context in the worker: catalog files go through the daemon."""

    remote_writer: CatalogWriter

    @cached_property
    def catalog_writer(self) -> CatalogWriter:
        return self.remote_writer


class _Channel:
    """Standard output (requests and reports, one JSON line each) and the answers read
    from standard input."""

    def __init__(self, store: ObjectStore, fence: BorrowedFence) -> None:
        self.store = store
        self.fence = fence
        self._next = 0
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.orphaned = asyncio.Event()

    def send(self, message: dict[str, Any]) -> None:
        # One write of one whole line, no await between: lines never interleave.
        sys.stdout.buffer.write(wire.encode(message))
        sys.stdout.buffer.flush()

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        self._next += 1
        ident = self._next
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        try:
            self.send({**message, "write": ident})
            return await future
        finally:
            self._waiting.pop(ident, None)

    async def read_answers(self, reader: asyncio.StreamReader) -> None:
        """Answers and lease expiries until standard input ends (the daemon is gone)."""
        while line := await reader.readline():
            message = json.loads(line)
            if "lease_expires_ns" in message:
                self.fence.extend(int(message["lease_expires_ns"]))
            elif (future := self._waiting.get(int(message.get("reply", -1)))) is not None:
                if not future.done():
                    future.set_result(message)
        self.fence.lose("the daemon closed the worker's standard input")
        self.orphaned.set()


async def _stdin_reader() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=wire.LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def _hold_if_asked() -> None:
    fifo = os.environ.get(HOLD_ENV)
    if fifo:

        def wait() -> None:
            with open(fifo, "rb") as held:
                held.read()

        await asyncio.to_thread(wait)


async def _main() -> int:
    with contextlib.suppress(OSError):
        os.nice(NICENESS)
    reader = await _stdin_reader()
    start = json.loads(await reader.readline() or b"null")
    if not isinstance(start, dict):
        print("audit_worker: no start document on standard input", file=sys.stderr)
        return EXIT_FAILED
    settings = Settings.model_validate(start["settings"])
    configure_logging(settings.logging)
    store = open_store_from_settings(settings.store)
    clock = store_clock(store, SystemClock())
    lease = Lease(
        key=start["lease"]["key"],
        record=LeaseRecord.model_validate(start["lease"]["record"]),
        etag=start["lease"]["etag"],
    )
    fence = BorrowedFence(
        store=store, clock=clock, lease=lease, ttl_s=settings.reconciler.lease_ttl_s
    )
    channel = _Channel(store, fence)
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    answers = asyncio.create_task(channel.read_answers(reader))
    metrics = ReconcilerMetrics(clock=clock)
    ctx = _WorkerContext(
        store=store,
        clock=clock,
        rng=random.Random(),
        settings=settings,
        metrics=metrics,
        fence=fence,
        log=structlog.get_logger("reconciler").bind(epoch=fence.epoch, audit_worker=os.getpid()),
        stopping=stopping,
        inventory=inventory_from_settings(settings),
        on_catalog_written=lambda hour, key: channel.send({"touched": hour.start_ns, "key": key}),
        remote_writer=RemoteCatalogWriter(
            channel, position=start["catalog_position"], epoch=fence.epoch, clock=clock
        ),
    )
    last_metrics = [0.0]

    def progress(update: AuditProgress) -> None:
        channel.send({"progress": wire.progress_doc(update)})
        if time.monotonic() - last_metrics[0] >= wire.METRICS_INTERVAL_S:
            last_metrics[0] = time.monotonic()
            channel.send({"metrics": wire.metric_snapshot(metrics)})

    work = asyncio.create_task(_audit(ctx, progress))
    orphaned = asyncio.create_task(channel.orphaned.wait())
    try:
        await asyncio.wait({work, orphaned}, return_when=asyncio.FIRST_COMPLETED)
        if not work.done():
            log.error("audit_worker_orphaned", detail="the daemon is gone: the audit stops")
            return EXIT_ORPHANED
        outcome = work.result()
        channel.send({"metrics": wire.metric_snapshot(metrics)})
        channel.send(outcome)
        return EXIT_OK if "result" in outcome else EXIT_FAILED
    finally:
        for task in (work, orphaned, answers):
            task.cancel()
        if ctx.inventory is not None:
            await ctx.inventory.close()
        await store.close()


async def _audit(
    ctx: ReconcilerContext, progress: Callable[[AuditProgress], None]
) -> dict[str, Any]:
    try:
        await ctx.check_fence()
        record = await configured_audit(ctx, progress=progress, inventory=ctx.inventory)
    except Exception as exc:
        ctx.log.warning("audit_worker_failed", error=repr(exc))
        return {"failed": type(exc).__name__, "message": str(exc)}
    return {"result": json.loads(record.to_json())}


def main() -> int:
    import uvloop

    try:
        return uvloop.run(_main())
    except KeyboardInterrupt:
        return EXIT_FAILED


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no waiting for the default executor's threads (a held FIFO read)
