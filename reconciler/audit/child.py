"""The daemon's side of a full audit run in a child process (`reconciler.audit.worker`).

`AuditChild.run` starts ``python -m reconciler.audit.worker`` with pipes on its standard
input and output, sends it the daemon's settings, lease and catalog writer position, and
then serves it until it exits:

- every sixth of the lease TTL, the lease's current expiry (the worker's fence holds only
  while that lies more than a sixth of the TTL ahead, as the daemon's own does);
- its catalog writes: each is made by the daemon's own `CatalogWriter` after a check of
  the daemon's fence, and answered with the key and ETag (or the error);
- the hours it wrote (to the compactor, through ``ctx.on_catalog_written``), its progress
  (to the progress callback and the audit gauges) and its counter snapshots
  (`audit_wire.MetricRelay`);
- at the end, the audit's final record, or why it failed.

The worker is stopped by its PID only: `AuditChild.terminate` sends SIGTERM (the audit
saves its progress and returns); whatever way `run` ends — the worker's exit, a
cancellation, an error — a worker still alive then is sent SIGKILL and reaped, so no
audit outlives the daemon's term. Should the daemon itself die, the worker's standard
input closes and it exits by itself.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import sys
from typing import Any

import structlog

from protocol import keys
from protocol.records import AuditRecord
from reconciler.audit import wire
from reconciler.audit.progress import ProgressCallback
from reconciler.context import ReconcilerContext
from store.lease import LeaseLost

log = structlog.get_logger(__name__)
WORKER_MODULE = "reconciler.audit.worker"


class AuditWorkerFailed(RuntimeError):
    """The audit worker ended without a record: its error, or how it exited."""


class AuditChild:
    def __init__(self, ctx: ReconcilerContext, *, progress: ProgressCallback | None) -> None:
        self._ctx = ctx
        self._progress = progress
        self._relay = wire.MetricRelay(ctx.metrics)
        self._process: asyncio.subprocess.Process | None = None
        self._writes: set[asyncio.Task[None]] = set()
        self._stdin_lock = asyncio.Lock()

    @property
    def pid(self) -> int | None:
        """The worker's PID while it runs (None before its start and once reaped)."""
        process = self._process
        return process.pid if process is not None and process.returncode is None else None

    def terminate(self) -> bool:
        """SIGTERM to a running worker (it saves its progress and exits); True if sent."""
        return self._signal(signal.SIGTERM)

    async def run(self) -> AuditRecord:
        """Run the audit in a worker; its final record. Raises `LeaseLost` when the worker
        found the lease gone, `AuditWorkerFailed` on any other end without a record."""
        ctx = self._ctx
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            WORKER_MODULE,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=wire.LINE_LIMIT,
        )
        self._process = process
        ctx.metrics.audit_running.set(1)
        ctx.log.info("audit_worker_started", pid=process.pid)
        renewals = asyncio.create_task(self._report_lease())
        try:
            await self._send(self._start_doc())
            outcome = await self._serve()
            code = await process.wait()
        finally:
            renewals.cancel()
            if process.returncode is None:
                self._signal(signal.SIGKILL)
            # Reap it; and let a catalog create already under way finish with its
            # catalog-created entry (bounded by the writer's retries), never half made.
            waits = [process.wait(), *self._writes]
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(asyncio.gather(*waits, return_exceptions=True))
            ctx.metrics.audit_running.set(0)
        ctx.log.info("audit_worker_exited", pid=process.pid, code=code)
        if "result" in outcome:
            return AuditRecord.model_validate(outcome["result"])
        if outcome.get("failed") == "LeaseLost":
            raise LeaseLost(keys.RECONCILER_LEASE_KEY, ctx.epoch, str(outcome.get("message")))
        if "failed" in outcome:
            raise AuditWorkerFailed(f"{outcome['failed']}: {outcome.get('message')}")
        raise AuditWorkerFailed(f"the audit worker (pid {process.pid}) exited with {code}")

    # --- serving the worker ------------------------------------------------------------

    def _start_doc(self) -> dict[str, Any]:
        ctx = self._ctx
        lease = ctx.fence.lease
        return {
            "settings": ctx.settings.model_dump(mode="json"),
            "lease": {
                "key": lease.key,
                "record": lease.record.model_dump(mode="json", by_alias=True),
                "etag": lease.etag,
            },
            "catalog_position": ctx.catalog_writer.position(),
        }

    async def _serve(self) -> dict[str, Any]:
        """Read the worker's lines until its standard output ends; its last word."""
        assert self._process is not None and self._process.stdout is not None
        outcome: dict[str, Any] = {}
        while line := await self._process.stdout.readline():
            try:
                message = json.loads(line)
            except ValueError:
                log.warning("audit_worker_unexpected_output", line=line[:200])
                continue
            if not isinstance(message, dict):
                continue
            if "write" in message:
                task = asyncio.create_task(self._write(message))
                self._writes.add(task)
                task.add_done_callback(self._writes.discard)
            elif "touched" in message:
                hour = keys.UtcHour.from_unix_ns(int(message["touched"]))
                self._ctx.on_catalog_written(hour, str(message["key"]))
            elif "progress" in message:
                self._on_progress(message["progress"])
            elif "metrics" in message:
                self._relay.apply(message["metrics"])
            elif "result" in message or "failed" in message:
                outcome = message
        return outcome

    async def _write(self, message: dict[str, Any]) -> None:
        ctx = self._ctx
        answer: dict[str, Any] = {"reply": message["write"]}
        try:
            await ctx.check_fence()
            hour = keys.UtcHour.from_unix_ns(int(message["hour_ns"]))
            key, etag = await ctx.catalog_writer.create_encoded(
                hour, base64.b64decode(message["body"]), writer=str(message["writer"])
            )
            answer.update(key=key, etag=etag)
        except Exception as exc:
            answer.update(error=type(exc).__name__, message=str(exc))
        await self._send(answer)

    def _on_progress(self, doc: dict[str, Any]) -> None:
        progress = wire.progress_of(doc)
        metrics = self._ctx.metrics
        metrics.audit_manifests.set(progress.manifests_seen)
        metrics.audit_quarantines.set(progress.quarantines_seen)
        metrics.audit_groups_done.set(progress.groups_done)
        if self._progress is not None:
            self._progress(progress)

    async def _report_lease(self) -> None:
        """The lease's expiry, every sixth of its TTL (the worker's fence margin)."""
        every_s = self._ctx.settings.reconciler.lease_ttl_s / 6
        while True:
            await asyncio.sleep(every_s)
            expires = self._ctx.fence.lease.record.expires_at_unix_ns
            if not self._ctx.fence.lost:
                await self._send({"lease_expires_ns": expires})

    async def _send(self, message: dict[str, Any]) -> None:
        process = self._process
        if process is None or process.stdin is None or process.returncode is not None:
            return
        async with self._stdin_lock:
            with contextlib.suppress(ConnectionError):
                process.stdin.write(wire.encode(message))
                await process.stdin.drain()

    def _signal(self, number: int) -> bool:
        process = self._process
        if process is None or process.returncode is not None:
            return False  # reaped: its PID may be another process's by now
        try:
            process.send_signal(number)
        except ProcessLookupError:
            return False
        return True
