"""Reconciler audit benchmark: `run_full_audit` against an in-run list-and-GET baseline.

    .venv/bin/python -m bench.reconcile [--manifests 100000] [--concurrency 32] [--quick]

One MiniStack (127.0.0.1, temp data dir), one bucket, one `store.s3.S3Store` (one client,
one connection pool) for every phase, one after the other:

1. **seed** N accepted manifests over ``--agents`` x ``--boots`` (agent groups are what
   the audit walks ``concurrency`` at a time), each with its raw blob and its 3 derived
   entries (`protocol.derived.manifest_backfill`): 5 objects per manifest. Accepted times
   spread over the last 23 h, so every manifest is younger than ``gc.retry_horizon_s`` and
   the audit keeps all 3 entries (older ones get 2: no ``raw-blobs-by-time``).
   ``--seed disk`` (default) writes MiniStack's persistence directory before the server
   starts (see `seed_on_disk` for the format, read from ministack 1.5.33's
   ``services/s3.py``); ``--seed put`` PUTs every object through the S3 API instead (128
   in flight), the slow but format-independent way. Either way the run then spot-checks
   objects through the API, the baseline's listing must find exactly N manifests, and the
   steady audit must repair nothing and find no problem.
2. **baseline**: list ``accepted/v1/`` (paginated) and GET every manifest with
   ``concurrency`` workers, nothing else. Run before and after the steady audit.
3. **audit, steady**: `reconciler.audit.run_full_audit` with ``[reconciler] concurrency``
   = ``--concurrency`` and ``verify_rate_per_s`` = ``--verify-rate`` (default: the
   setting's default, 200/s): blob verification (`reconciler.verify`) runs alongside the
   walk at that rate, as deployed. Then **audit, verification paused**: the same audit
   with ``verify_rate_per_s`` = 0.001 (one blob), which isolates the walk itself.
4. References that explain the gap: **verify floor** (list, GET + parse each manifest, GET
   + SHA-256 its blob: what any audit that verifies blobs must do) and **412 probe**
   (If-None-Match PUTs of derived entries that exist: what the audit pays per entry that
   is already there).
5. **damage**: delete ~``--missing-fraction`` of the derived entries (timed apart), then
   **audit, repair**: the same audit, now re-creating them.
6. **audit, throttled** (off by default): the audit stopped after ``--throttled-s``
   seconds through ``ctx.stopping``.

Store requests are counted per HTTP request (operation x status) with aiobotocore's
``before-call``/``after-call`` events on the store's client; CPU per process from /proc
(`bench._common.CpuMeter`): MiniStack, this process (``driver``: the benchmark and the
reconciler code it runs), and ``others`` (the rest of this shared machine).

Benchmarks are not tests: nothing in ``tests/`` imports this module.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import cProfile
import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform
import pstats
import random
import shutil
import sys
import tempfile
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import uvloop

from bench import _common as c
from chaos.s3_server import (
    AWS_ENV_TO_REMOVE,
    CREDENTIALS,
    REGION,
    RunningServer,
    create_bucket,
    dummy_aws_env,
    start_ministack,
    unique_bucket_name,
)
from config import (
    GcSettings,
    LoggingSettings,
    ReconcilerSettings,
    Settings,
    configure_logging,
)
from protocol import derived, keys
from protocol.clock import SystemClock
from protocol.records import AcceptedManifest
from reconciler.audit import AuditProgress, run_full_audit
from reconciler.context import ReconcilerContext, open_context
from reconciler.metrics import ReconcilerMetrics
from store.errors import PreconditionFailed
from store.s3 import S3Store

TARGET = 0.7
FULL_MANIFESTS = 100_000
QUICK_MANIFESTS = 10_000
VERDICT_PHASES = ("audit steady", "audit steady, verification paused")
PAUSED_PHASE = VERDICT_PHASES[1]
PAUSED_VERIFY_RATE = 1e-3
"""One blob verified, then a ~1000 s wait for the next token: verification is idle."""
MINISTACK_ACCOUNT = "000000000000"
"""MiniStack's account for credentials that are not a 12-digit account id (ours)."""
MINISTACK_LOAD_TIMEOUT_S = 1800.0  # it reads every persisted object's sidecar at start
PUT_SEED_CONCURRENCY = 128
SPOT_CHECKS = 64
HOUR_NS = 3600 * keys.NS_PER_S
NOISY_CORES = 0.2


# --- the synthetic fleet -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fleet:
    """``manifests`` accepted batches over ``agents`` x ``boots`` (agent-major order), each
    with a unique ``blob_bytes`` frame (the reconciler hashes frames, never decodes them)."""

    manifests: int
    agents: int
    boots: int
    blob_bytes: int
    first_ns: int
    span_ns: int

    @property
    def per_boot(self) -> int:
        return math.ceil(self.manifests / (self.agents * self.boots))

    def batches(self) -> Iterator[tuple[AcceptedManifest, bytes]]:
        index = 0
        for agent in range(self.agents):
            for boot in range(self.boots):
                for seq in range(self.per_boot):
                    if index >= self.manifests:
                        return
                    yield self._batch(agent, boot, seq, index)
                    index += 1

    def _batch(self, agent: int, boot: int, seq: int, index: int) -> tuple[AcceptedManifest, bytes]:
        stamp = f"lm-bench-reconcile agent={agent} boot={boot} seq={seq};".encode()
        frame = (stamp * (self.blob_bytes // len(stamp) + 1))[: self.blob_bytes]
        sha = hashlib.sha256(frame).hexdigest()
        manifest = AcceptedManifest(
            agent_id=f"bench-agent-{agent:05d}",
            boot_id=str(uuid.UUID(int=(agent << 32) | (boot + 1))),
            seq_start=seq * 10,
            seq_end=seq * 10 + 9,
            record_count=10,
            frame_sha256=sha,
            frame_bytes=len(frame),
            raw_blob_key=keys.raw_blob_key(sha),
            accepted_at_unix_ns=self.first_ns + index * self.span_ns // self.manifests,
            collector_id="bench-collector",
        )
        return manifest, frame


def batch_objects(manifest: AcceptedManifest, frame: bytes) -> list[tuple[str, bytes]]:
    """What a collector leaves for one accepted batch: blob, manifest, 3 derived entries."""
    return [
        (manifest.raw_blob_key, frame),
        (manifest.manifest_key, manifest.to_json()),
        *((entry.key, entry.body) for entry in derived.manifest_backfill(manifest)),
    ]


# --- seeding -------------------------------------------------------------------------------


@dataclass
class SeedResult:
    mode: str
    objects: int = 0
    bytes: int = 0
    write_s: float = 0.0
    """Writing the objects (disk: files; put: every PUT answered)."""
    server_start_s: float = 0.0
    """MiniStack start until its health check answers."""
    first_request_s: float = 0.0
    """Its first S3 request: MiniStack imports its S3 service then, and loads every
    persisted object's metadata."""
    spot_checked: int = 0
    work_root: str = ""


def _plain_key_ok(key: str) -> bool:
    # MiniStack stores a key at its own path only if every segment is non-empty, not "." or
    # "..", at most 200 bytes, and does not end in ".meta.json" or ".tmp" (else under an
    # encoded name); all our keys qualify, and the seeder refuses any that would not.
    return all(
        part not in ("", ".", "..")
        and len(part.encode()) <= 200
        and not part.endswith((".meta.json", ".tmp"))
        for part in key.split("/")
    ) and not key.startswith(".ministack-keys")


def seed_on_disk(bucket_dir: Path, fleet: Fleet, result: SeedResult) -> None:
    """Write every object into MiniStack's persistence directory (S3_PERSIST=1) while the
    server is not running; it loads them when its S3 service is first used.

    Format (ministack 1.5.33, ``services/s3.py``: `_persist_object`, `_load_persisted_bucket`,
    `_read_body`; checked against what a PutObject leaves on disk):
    ``<S3_DATA_DIR>/<account>/<bucket>/<key>`` holds the body, and ``<key>.meta.json`` a
    JSON sidecar: content_type, content_encoding, etag (quoted MD5 hex), last_modified
    (ISO 8601, ms, ``Z``), size, metadata, preserved_headers, storage_class, checksums
    (``CRC32``: base64 of the big-endian CRC-32, what it computes on PUT), version_id, key.
    At start it walks the bucket directory and keeps only the metadata in memory; GETs
    read the body from the file, exactly as for objects that arrived by PUT (it drops
    their bodies from memory once persisted).

    """
    last_modified = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    root = str(bucket_dir)
    made: set[str] = set()
    started = time.perf_counter()
    for manifest, frame in fleet.batches():
        for key, body in batch_objects(manifest, frame):
            if not _plain_key_ok(key):
                raise ValueError(f"{key!r} is not a plain MiniStack key: use --seed put")
            path = os.path.join(root, key)
            parent = os.path.dirname(path)
            if parent not in made:
                os.makedirs(parent, exist_ok=True)
                made.add(parent)
            with open(path, "wb") as out:
                out.write(body)
            meta = {
                "content_type": "application/octet-stream",
                "content_encoding": None,
                "etag": f'"{hashlib.md5(body).hexdigest()}"',
                "last_modified": last_modified,
                "size": len(body),
                "metadata": {},
                "preserved_headers": {},
                "storage_class": "STANDARD",
                "checksums": {
                    "CRC32": base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()
                },
                "version_id": None,
                "key": key,
            }
            with open(path + ".meta.json", "w") as out:
                out.write(json.dumps(meta))
            result.objects += 1
            result.bytes += len(body)
    result.write_s = time.perf_counter() - started


async def seed_by_put(endpoint_url: str, bucket: str, fleet: Fleet, result: SeedResult) -> None:
    """Every object by If-None-Match PUT, ``PUT_SEED_CONCURRENCY`` in flight."""
    store = S3Store(
        bucket=bucket,
        endpoint_url=endpoint_url,
        region=REGION,
        credentials=CREDENTIALS,
        max_pool_connections=PUT_SEED_CONCURRENCY,
    )
    queue: asyncio.Queue[tuple[str, bytes] | None] = asyncio.Queue(maxsize=4 * PUT_SEED_CONCURRENCY)

    async def worker() -> None:
        while (item := await queue.get()) is not None:
            key, body = item
            await store.put(key, body, if_none_match=True)
            result.objects += 1
            result.bytes += len(body)

    started = time.perf_counter()
    try:
        async with asyncio.TaskGroup() as group:
            for _ in range(PUT_SEED_CONCURRENCY):
                group.create_task(worker())
            for manifest, frame in fleet.batches():
                for item in batch_objects(manifest, frame):
                    await queue.put(item)
            for _ in range(PUT_SEED_CONCURRENCY):
                await queue.put(None)
    finally:
        await store.close()
    result.write_s = time.perf_counter() - started


async def spot_check(store: S3Store, fleet: Fleet, rng: random.Random) -> int:
    """GET a sample of seeded objects of every kind and compare bodies; an If-None-Match
    PUT of an existing derived entry must be refused. Raises on any mismatch."""
    picks = set(rng.sample(range(fleet.manifests), min(SPOT_CHECKS, fleet.manifests)))
    checked = 0
    refused = False
    for index, (manifest, frame) in enumerate(fleet.batches()):
        if index not in picks:
            continue
        for key, body in batch_objects(manifest, frame):
            got, etag = await store.get(key)
            if got != body:
                raise RuntimeError(f"seeded object {key!r} reads back different bytes")
            if etag.strip('"') != hashlib.md5(body).hexdigest():
                raise RuntimeError(f"seeded object {key!r} has ETag {etag!r}, not its MD5")
            checked += 1
        if not refused:
            entry = derived.manifest_backfill(manifest)[0]
            try:
                await store.put(entry.key, entry.body, if_none_match=True)
            except PreconditionFailed:
                refused = True
            else:
                raise RuntimeError(f"If-None-Match PUT of seeded {entry.key!r} was not refused")
    return checked


# --- counting store requests ---------------------------------------------------------------


class RequestTally:
    """Every HTTP request the store's aiobotocore client makes, by operation and status,
    and the client-side time each took (``before-call`` to ``after-call``)."""

    _T0 = "lm_bench_t0"

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.seconds: Counter[str] = Counter()
        self.listed_keys = 0

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-call.s3", self._before)
        client.meta.events.register("after-call.s3", self._after)
        client.meta.events.register("after-call-error.s3", self._error)

    def _before(self, context: dict[str, Any], **_: Any) -> None:
        context[self._T0] = time.perf_counter()  # returns None: never short-circuits the call

    def _after(
        self, http_response: Any, parsed: Any, model: Any, context: dict[str, Any], **_: Any
    ) -> None:
        self._add(f"{model.name} {http_response.status_code}", context)
        if model.name == "ListObjectsV2" and isinstance(parsed, dict):
            # Every listed key is parsed (XML, and its LastModified by dateutil) by botocore.
            self.listed_keys += len(parsed.get("Contents") or ())

    def _error(self, exception: BaseException, context: dict[str, Any], **_: Any) -> None:
        self._add(f"{context.get('operation_name', '?')} {type(exception).__name__}", context)

    def _add(self, label: str, context: dict[str, Any]) -> None:
        self.counts[label] += 1
        started = context.get(self._T0)
        if started is not None:
            self.seconds[label] += time.perf_counter() - started

    def snapshot(self) -> tuple[Counter[str], Counter[str], int]:
        return Counter(self.counts), Counter(self.seconds), self.listed_keys


async def instrumented_store(
    endpoint_url: str, bucket: str, pool: int
) -> tuple[S3Store, RequestTally]:
    store = S3Store(
        bucket=bucket,
        endpoint_url=endpoint_url,
        region=REGION,
        credentials=CREDENTIALS,
        max_pool_connections=pool,
    )
    await store.open()
    tally = RequestTally()
    # Benchmark-only instrumentation: S3Store keeps its client private; the events count
    # real HTTP requests (with botocore retries off, one per attempt).
    tally.attach(await store._s3())
    return store, tally


# --- phases --------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    manifests: int = 0
    """Units of work: manifests (probes: requests)."""
    unit: str = "manifest"
    elapsed_s: float = 0.0
    requests: dict[str, int] = field(default_factory=dict)
    request_s: dict[str, float] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)
    window_rate: float | None = None
    """Time-bounded audits: units/s between 25% and 100% of the window (past the start-up
    burst of discovery listings, before the stop drains)."""
    listed_keys: int = 0
    """Keys returned by the phase's list requests (each one parsed by the client)."""
    busy_cores_before: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        if self.window_rate is not None:
            return self.window_rate
        return self.manifests / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def per_unit(self, value: float) -> float:
        return value / self.manifests if self.manifests else math.nan

    @property
    def others_cores(self) -> float:
        return self.cpu_s.get("others", 0.0) / self.elapsed_s if self.elapsed_s > 0 else 0.0


class Bench:
    def __init__(
        self,
        *,
        server: RunningServer,
        store: S3Store,
        tally: RequestTally,
        fleet: Fleet,
        concurrency: int,
        quiet_wait_s: float,
        phase_timeout_s: float,
    ) -> None:
        self.server = server
        self.store = store
        self.tally = tally
        self.fleet = fleet
        self.concurrency = concurrency
        self.quiet_wait_s = quiet_wait_s
        self.phase_timeout_s = phase_timeout_s
        self.phases: list[Phase] = []

    async def measure(
        self, name: str, run: Callable[[Phase], Awaitable[int]], *, unit: str = "manifest"
    ) -> Phase:
        phase = Phase(name=name, unit=unit)
        phase.busy_cores_before = await asyncio.to_thread(
            c.wait_for_quiet, max_wait_s=self.quiet_wait_s
        )
        counts_before, seconds_before, listed_before = self.tally.snapshot()
        assert self.server.pid is not None
        meter = c.CpuMeter({"ministack": [self.server.pid], "driver": [os.getpid()]})
        meter.start()
        started = time.perf_counter()
        async with asyncio.timeout(self.phase_timeout_s):
            phase.manifests = await run(phase)
        phase.elapsed_s = time.perf_counter() - started
        phase.cpu_s = meter.stop()
        counts_after, seconds_after, listed_after = self.tally.snapshot()
        phase.listed_keys = listed_after - listed_before
        phase.requests = dict(counts_after - counts_before)
        phase.request_s = {k: seconds_after[k] - seconds_before[k] for k in phase.requests}
        self.phases.append(phase)
        print(_phase_line(phase), flush=True)
        return phase

    # --- baseline and references ------------------------------------------------------

    async def _listed_keys(self, queue: asyncio.Queue[str | None]) -> int:
        listed = 0
        async for info in self.store.list(keys.ACCEPTED_PREFIX):
            await queue.put(info.key)
            listed += 1
        for _ in range(self.concurrency):
            await queue.put(None)
        return listed

    async def _over_manifests(self, each: Callable[[str], Awaitable[None]]) -> int:
        """List ``accepted/v1/`` and run ``each`` on every key, ``concurrency`` at once."""
        queue: asyncio.Queue[str | None] = asyncio.Queue(maxsize=4 * self.concurrency)
        done = 0

        async def worker() -> None:
            nonlocal done
            while (key := await queue.get()) is not None:
                await each(key)
                done += 1

        async with asyncio.TaskGroup() as group:
            for _ in range(self.concurrency):
                group.create_task(worker())
            listed = await self._listed_keys(queue)
        if listed != self.fleet.manifests or done != listed:
            raise RuntimeError(
                f"listed {listed} manifests and read {done}; seeded {self.fleet.manifests}"
            )
        return done

    async def baseline(self, phase: Phase) -> int:
        async def get(key: str) -> None:
            await self.store.get(key)

        return await self._over_manifests(get)

    async def verify_floor(self, phase: Phase) -> int:
        async def read_and_verify(key: str) -> None:
            body, _etag = await self.store.get(key)
            manifest = AcceptedManifest.from_json(body)
            blob, _etag = await self.store.get(manifest.raw_blob_key)
            if hashlib.sha256(blob).hexdigest() != manifest.frame_sha256:
                raise RuntimeError(f"blob of {key!r} does not match its manifest")

        return await self._over_manifests(read_and_verify)

    def probe_412(self, requests: int) -> Callable[[Phase], Awaitable[int]]:
        async def run(phase: Phase) -> int:
            entries = self._sample_entries(requests, random.Random(7))
            queue: asyncio.Queue[derived.DerivedEntry | None] = asyncio.Queue()
            for entry in entries:
                queue.put_nowait(entry)
            for _ in range(self.concurrency):
                queue.put_nowait(None)  # one stop sign per worker, behind the entries
            refused = 0

            async def worker() -> None:
                nonlocal refused
                while (entry := await queue.get()) is not None:
                    try:
                        await self.store.put(entry.key, entry.body, if_none_match=True)
                    except PreconditionFailed:
                        refused += 1
                    else:
                        raise RuntimeError(f"{entry.key!r} was missing: the seed is incomplete")

            async with asyncio.TaskGroup() as group:
                for _ in range(self.concurrency):
                    group.create_task(worker())
            return refused

        return run

    def _sample_entries(self, count: int, rng: random.Random) -> list[derived.DerivedEntry]:
        wanted = set(rng.sample(range(self.fleet.manifests), min(count, self.fleet.manifests)))
        return [
            derived.manifest_backfill(manifest)[rng.randrange(3)]
            for index, (manifest, _frame) in enumerate(self.fleet.batches())
            if index in wanted
        ]

    # --- the audit --------------------------------------------------------------------

    def audit(
        self,
        ctx: ReconcilerContext,
        *,
        stop_after_s: float | None = None,
        profiler: cProfile.Profile | None = None,
    ) -> Callable[[Phase], Awaitable[int]]:
        async def run(phase: Phase) -> int:
            started = time.perf_counter()
            last_print = [started]
            samples: list[tuple[float, int]] = [(0.0, 0)]
            verified = [0]

            def progress(p: AuditProgress) -> None:
                now = time.perf_counter()
                verified[0] = p.blobs_verified
                samples.append((now - started, p.manifests_seen))
                if now - last_print[0] >= 15.0:
                    last_print[0] = now
                    rate = p.manifests_seen / (now - started)
                    print(
                        f"    ... {p.manifests_seen} manifests, {rate:.0f}/s, "
                        f"repaired {p.repaired}, problems {p.problems}, "
                        f"blobs verified {p.blobs_verified}",
                        flush=True,
                    )

            stopper = None
            if stop_after_s is not None:
                stopper = asyncio.get_running_loop().call_later(stop_after_s, ctx.stopping.set)
            if profiler is not None:
                profiler.enable()
            try:
                record = await run_full_audit(ctx, progress=progress)
            finally:
                if profiler is not None:
                    profiler.disable()
                if stopper is not None:
                    stopper.cancel()
            if stop_after_s is not None:
                phase.window_rate = _window_rate(samples, 0.25 * stop_after_s, stop_after_s)
            phase.notes.update(
                blobs_verified=verified[0],
                status=record.status,
                repaired=dict(record.repaired),
                problems=record.problems,
                stopped=ctx.stopping.is_set(),
            )
            return record.manifests_seen

        return run

    # --- damage -----------------------------------------------------------------------

    async def delete_fraction(self, fraction: float, rng: random.Random) -> tuple[int, float]:
        """Delete each derived entry with probability ``fraction``; (deleted, seconds)."""
        doomed = [
            entry.key
            for manifest, _frame in self.fleet.batches()
            for entry in derived.manifest_backfill(manifest)
            if rng.random() < fraction
        ]
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        for key in doomed:
            queue.put_nowait(key)
        for _ in range(self.concurrency):
            queue.put_nowait(None)

        async def worker() -> None:
            while (key := await queue.get()) is not None:
                await self.store.delete(key)

        started = time.perf_counter()
        async with asyncio.timeout(self.phase_timeout_s), asyncio.TaskGroup() as group:
            for _ in range(self.concurrency):
                group.create_task(worker())
        return len(doomed), time.perf_counter() - started


def _window_rate(samples: list[tuple[float, int]], start_s: float, end_s: float) -> float:
    """Progress rate between the last samples at or before ``start_s`` and ``end_s``."""
    first = max((s for s in samples if s[0] <= start_s), default=samples[0])
    last = max((s for s in samples if s[0] <= end_s), default=samples[-1])
    return (last[1] - first[1]) / (last[0] - first[0]) if last[0] > first[0] else math.nan


def audit_settings(concurrency: int, verify_rate_per_s: float) -> Settings:
    return Settings(
        reconciler=ReconcilerSettings(concurrency=concurrency, verify_rate_per_s=verify_rate_per_s),
        gc=GcSettings(enabled=False),
    )


# --- reporting -----------------------------------------------------------------------------


def _phase_line(phase: Phase) -> str:
    cpu = phase.cpu_s
    return (
        f"  {phase.name:<34} {phase.manifests:>8} {phase.unit}s in {phase.elapsed_s:7.1f}s "
        f"= {phase.rate:8.1f}/s   req/{phase.unit} {phase.per_unit(phase.total_requests):5.2f}   "
        f"cpu ms/{phase.unit}: ministack {1000 * phase.per_unit(cpu.get('ministack', 0)):5.2f} "
        f"driver {1000 * phase.per_unit(cpu.get('driver', 0)):5.2f}   "
        f"others {phase.others_cores:4.2f} cores"
    )


def _cpu_bound_rate(phase: Phase) -> float:
    slowest = max(phase.cpu_s.get("driver", 0.0), phase.cpu_s.get("ministack", 0.0))
    return phase.manifests / slowest if slowest > 0 else math.nan


def _requests_line(phase: Phase) -> str:
    parts = []
    for label in sorted(phase.requests, key=lambda k: -phase.requests[k]):
        count = phase.requests[label]
        mean_ms = 1000 * phase.request_s.get(label, 0.0) / count
        parts.append(f"{label}: {phase.per_unit(count):.4f} ({mean_ms:.1f} ms)")
    if phase.listed_keys:
        parts.append(f"listed keys: {phase.per_unit(phase.listed_keys):.2f}")
    return ", ".join(parts)


@dataclass
class Report:
    command: str
    args: dict[str, Any]
    fleet: Fleet
    seed: SeedResult
    phases: list[Phase]
    damage: dict[str, Any]
    started: str
    loadavg_start: tuple[float, float, float]
    loadavg_end: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def phase(self, name: str) -> Phase | None:
        return next((p for p in self.phases if p.name == name), None)

    def baseline_rate(self) -> float:
        rates = [p.rate for p in self.phases if p.name.startswith("baseline")]
        return sum(rates) / len(rates) if rates else math.nan

    def verdict(self, name: str = "audit steady") -> tuple[float, str]:
        audit = self.phase(name)
        ratio = audit.rate / self.baseline_rate() if audit else math.nan
        return ratio, ("PASS" if ratio >= TARGET else "MISS")

    def cpu_ratio(self, name: str = "audit steady") -> float:
        """The ratio on an otherwise idle machine, estimated from CPU per manifest: the
        driver and MiniStack are each one Python thread, so a phase runs at most at
        1 / max(driver, MiniStack CPU per manifest). Robust to other people's load."""
        audit = self.phase(name)
        bases = [_cpu_bound_rate(p) for p in self.phases if p.name.startswith("baseline")]
        if audit is None or not bases:
            return math.nan
        return _cpu_bound_rate(audit) / (sum(bases) / len(bases))

    def versions(self) -> str:
        names = ("ministack", "aiobotocore", "botocore", "uvloop")
        found = []
        for name in names:
            try:
                found.append(f"{name} {metadata.version(name)}")
            except metadata.PackageNotFoundError:
                continue
        return f"Python {platform.python_version()}, " + ", ".join(found)

    def print_table(self) -> None:
        base = self.baseline_rate()
        print()
        print(
            f"{'phase':<34} {'units':>8} {'seconds':>8} {'units/s':>9} {'x base':>7} "
            f"{'req/unit':>8} {'ms cpu/unit (store | driver)':>30} {'others':>7}"
        )
        for p in self.phases:
            ratio = p.rate / base if p.unit == "manifest" else math.nan
            cpu = p.cpu_s
            print(
                f"{p.name:<34} {p.manifests:>8} {p.elapsed_s:>8.1f} {p.rate:>9.1f} "
                f"{ratio:>7.2f} {p.per_unit(p.total_requests):>8.2f} "
                f"{1000 * p.per_unit(cpu.get('ministack', 0)):>14.2f} | "
                f"{1000 * p.per_unit(cpu.get('driver', 0)):<13.2f} {p.others_cores:>7.2f}"
            )
        print()
        print("store requests per unit (mean client-side latency):")
        for p in self.phases:
            print(f"  {p.name}: {_requests_line(p)}")
            if p.notes:
                print(f"      {p.notes}")
        print()
        for name in VERDICT_PHASES:
            if self.phase(name) is None:
                continue
            ratio, verdict = self.verdict(name)
            print(
                f"{name} / baseline = {ratio:.2f} (target >= {TARGET}): {verdict}   "
                f"[baseline {base:.1f} manifests/s = mean of "
                f"{', '.join(f'{p.rate:.1f}' for p in self.phases if p.name.startswith('baseline'))}]"
            )
            print(
                f"  CPU-bound estimate (1 / max(driver, MiniStack CPU per manifest), insensitive "
                f"to other load): {self.cpu_ratio(name):.2f}"
            )
        noisy = [p.name for p in self.phases if p.others_cores > NOISY_CORES]
        if noisy:
            print(f"NOTE: other processes used > {NOISY_CORES} cores during: {', '.join(noisy)}")

    def markdown(self) -> str:
        base = self.baseline_rate()
        s = self.seed
        lines = [
            f"Run {self.started}, `{self.command}`",
            "",
            f"- Machine: {os.cpu_count()} cores (shared), {platform.platform()}; "
            f"{self.versions()}. Load average at start "
            f"{'/'.join(f'{v:.2f}' for v in self.loadavg_start)}, at end "
            f"{'/'.join(f'{v:.2f}' for v in self.loadavg_end)}.",
            f"- Fleet: {self.fleet.manifests} accepted manifests, {self.fleet.agents} agents x "
            f"{self.fleet.boots} boots ({self.fleet.per_boot} per boot), {self.fleet.blob_bytes}-byte "
            f"blobs, 3 derived entries each; concurrency {self.args['concurrency']} (baseline "
            f"workers = `[reconciler] concurrency`).",
            f"- Seeding ({s.mode}): {s.objects} objects, {s.bytes / c.MiB:.1f} MiB written in "
            f"{s.write_s:.1f} s; MiniStack start {s.server_start_s:.1f} s + first S3 request "
            f"(loads the persisted objects) {s.first_request_s:.1f} s; data dir under "
            f"`{s.work_root}`; {s.spot_checked} objects spot-checked through the API.",
        ]
        if self.damage:
            lines.append(
                f"- Damage for the repair run: {self.damage['deleted']} derived entries deleted "
                f"({self.damage['fraction']:.0%} each) in {self.damage['seconds']:.1f} s."
            )
        lines += [
            "",
            "| phase | units | s | units/s | x baseline | store req/unit | MiniStack ms CPU/unit "
            "| driver ms CPU/unit | others (cores) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for p in self.phases:
            ratio_p = f"{p.rate / base:.2f}" if p.unit == "manifest" else "-"
            cpu = p.cpu_s
            lines.append(
                f"| {p.name} | {p.manifests} {p.unit}s | {p.elapsed_s:.1f} | {p.rate:.1f} | "
                f"{ratio_p} | {p.per_unit(p.total_requests):.2f} | "
                f"{1000 * p.per_unit(cpu.get('ministack', 0)):.2f} | "
                f"{1000 * p.per_unit(cpu.get('driver', 0)):.2f} | {p.others_cores:.2f} |"
            )
        lines += ["", "Requests per unit by operation and status (mean client latency):", ""]
        for p in self.phases:
            lines.append(f"- {p.name}: {_requests_line(p)}" + (f" — {p.notes}" if p.notes else ""))
        lines.append("")
        for name in VERDICT_PHASES:
            if self.phase(name) is None:
                continue
            ratio, verdict = self.verdict(name)
            lines.append(
                f"- **{name} / baseline = {ratio:.2f}** (target >= {TARGET}): **{verdict}** "
                f"(baseline = mean of the baseline runs, {base:.1f} manifests/s). "
                f"CPU-bound estimate (1 / max(driver, MiniStack CPU per manifest), "
                f"insensitive to other load): {self.cpu_ratio(name):.2f}."
            )
        return "\n".join(lines)


# --- the run -------------------------------------------------------------------------------


async def run(args: argparse.Namespace, work_dir: Path, report: Report) -> None:
    fleet = report.fleet
    data_dir = work_dir / "ministack"
    bucket = unique_bucket_name("lm-bench-rec")
    seed = report.seed
    print(
        f"fleet: {fleet.manifests} manifests, {fleet.agents} agents x {fleet.boots} boots, "
        f"{fleet.blob_bytes}-byte blobs; seeding by {seed.mode} ...",
        flush=True,
    )
    if seed.mode == "disk":
        await asyncio.to_thread(
            seed_on_disk, data_dir / "s3" / MINISTACK_ACCOUNT / bucket, fleet, seed
        )
        print(f"  wrote {seed.objects} objects in {seed.write_s:.1f}s; starting MiniStack ...")
    started = time.perf_counter()
    server = await asyncio.to_thread(start_ministack, data_dir, timeout_s=MINISTACK_LOAD_TIMEOUT_S)
    try:
        seed.server_start_s = time.perf_counter() - started
        print(f"  MiniStack pid {server.pid} ready in {seed.server_start_s:.1f}s", flush=True)
        if seed.mode == "put":
            await asyncio.to_thread(create_bucket, server.endpoint_url, bucket)
            await seed_by_put(server.endpoint_url, bucket, fleet, seed)
            print(f"  PUT {seed.objects} objects in {seed.write_s:.1f}s", flush=True)
        pool = max(64, 2 * args.concurrency)
        store, tally = await instrumented_store(server.endpoint_url, bucket, pool)
        try:
            started = time.perf_counter()
            await store.head(next(fleet.batches())[0].manifest_key)
            seed.first_request_s = time.perf_counter() - started
            print(f"  first S3 request answered in {seed.first_request_s:.1f}s", flush=True)
            seed.spot_checked = await spot_check(store, fleet, random.Random(3))
            await _phases(args, server, store, tally, report)
        finally:
            await store.close()
    finally:
        server.stop()


async def _phases(
    args: argparse.Namespace,
    server: RunningServer,
    store: S3Store,
    tally: RequestTally,
    report: Report,
) -> None:
    bench = Bench(
        server=server,
        store=store,
        tally=tally,
        fleet=report.fleet,
        concurrency=args.concurrency,
        quiet_wait_s=args.quiet_wait_s,
        phase_timeout_s=args.phase_timeout_s,
    )
    report.phases = bench.phases
    clock = SystemClock()
    ctx = await open_context(
        store,
        settings=audit_settings(args.concurrency, args.verify_rate),
        clock=clock,
        rng=random.Random(11),
        metrics=ReconcilerMetrics(clock=clock),
        owner="bench-reconciler",
    )
    print("phases:", flush=True)
    await bench.measure("baseline (list + GET)", bench.baseline)
    profiler = cProfile.Profile() if args.profile is not None else None
    steady = await bench.measure("audit steady", bench.audit(ctx, profiler=profiler))
    if profiler is not None:
        with args.profile.open("w") as out:
            stats = pstats.Stats(profiler, stream=out)
            stats.sort_stats("tottime").print_stats(40)
            stats.sort_stats("cumulative").print_stats(60)
        print(f"  profile of the steady audit (driver process): {args.profile}", flush=True)
    if steady.notes.get("repaired") or steady.notes.get("problems"):
        raise RuntimeError(f"the steady audit found work: the seed is incomplete ({steady.notes})")
    if steady.notes.get("status") != "completed" or steady.manifests != report.fleet.manifests:
        raise RuntimeError(f"the steady audit did not complete: {steady.notes}")
    await bench.measure("baseline again", bench.baseline)
    paused = dataclasses.replace(
        ctx, settings=audit_settings(args.concurrency, PAUSED_VERIFY_RATE), stopping=asyncio.Event()
    )
    walk = await bench.measure(PAUSED_PHASE, bench.audit(paused))
    if walk.notes.get("status") != "completed" or walk.manifests != report.fleet.manifests:
        raise RuntimeError(f"the paused-verification audit did not complete: {walk.notes}")
    if not args.no_references:
        await bench.measure("verify floor (GET manifest+blob)", bench.verify_floor)
        await bench.measure(
            "412 probe (existing entry PUT)", bench.probe_412(args.probe_requests), unit="request"
        )
    if args.missing_fraction > 0:
        deleted, seconds = await bench.delete_fraction(args.missing_fraction, random.Random(5))
        report.damage = {"deleted": deleted, "seconds": seconds, "fraction": args.missing_fraction}
        print(f"  deleted {deleted} derived entries in {seconds:.1f}s", flush=True)
        repair = await bench.measure("audit repair", bench.audit(ctx))
        created = sum(
            n for kind, n in repair.notes.get("repaired", {}).items() if kind != "rollup-dirty"
        )
        if created != deleted:
            raise RuntimeError(f"the repair audit re-created {created} of {deleted} entries")
    if args.throttled_s > 0:
        throttled = dataclasses.replace(
            ctx,
            settings=audit_settings(args.concurrency, args.verify_rate),
            stopping=asyncio.Event(),
        )
        await bench.measure(
            f"audit, stopped after {args.throttled_s:.0f}s",
            bench.audit(throttled, stop_after_s=args.throttled_s),
        )
    await ctx.fence.release()


def default_work_root(fleet: Fleet) -> str:
    """/dev/shm when it has room: creating files on this shared VM's disk took ~1 ms each
    while other engineers' runs were fsyncing (25 us on tmpfs), and seeding creates two
    files per object. Reads come from the page cache either way; MiniStack never fsyncs."""
    need = fleet.manifests * (5 * 2 * 4096 + fleet.blob_bytes)  # 4 KiB pages per file
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 3 * need:
        return str(shm)
    return tempfile.gettempdir()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reconcile",
        description="Full-audit throughput against an in-run list-and-GET baseline on MiniStack.",
    )
    parser.add_argument(
        "--manifests",
        type=int,
        default=None,
        help=f"accepted manifests to seed (default {FULL_MANIFESTS}; --quick: {QUICK_MANIFESTS})",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 10k manifests, 64 agents")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=32,
        help="[reconciler] concurrency, and the baseline's GET workers",
    )
    parser.add_argument(
        "--agents", type=int, default=None, help="agents (default 256; --quick: 64)"
    )
    parser.add_argument("--boots", type=int, default=2, help="boots per agent")
    parser.add_argument("--blob-bytes", type=int, default=1024)
    parser.add_argument(
        "--seed",
        choices=("disk", "put"),
        default="disk",
        help="write MiniStack's data dir before it starts (fast), or PUT everything",
    )
    parser.add_argument(
        "--missing-fraction",
        type=float,
        default=0.1,
        help="fraction of derived entries deleted before the repair audit (0: skip)",
    )
    parser.add_argument(
        "--probe-requests",
        type=int,
        default=10_000,
        help="If-None-Match PUTs of existing entries in the 412 probe",
    )
    parser.add_argument(
        "--no-references", action="store_true", help="skip the verify-floor and 412-probe phases"
    )
    parser.add_argument(
        "--throttled-s",
        type=float,
        default=0.0,
        help="an extra audit stopped after this many seconds (0: skip, the default)",
    )
    parser.add_argument(
        "--verify-rate",
        type=float,
        default=ReconcilerSettings().verify_rate_per_s,
        help="[reconciler] verify_rate_per_s of the steady and repair audits "
        "(default: the setting's default)",
    )
    parser.add_argument(
        "--quiet-wait-s",
        type=float,
        default=15.0,
        help="wait at most this long for a quiet machine before each phase",
    )
    parser.add_argument("--phase-timeout-s", type=float, default=7200.0)
    parser.add_argument("--json", type=Path, default=None, help="write the results here too")
    parser.add_argument(
        "--markdown", type=Path, default=None, help="write a RESULTS.md-ready section here"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="cProfile the steady audit (this process) and write the top functions here",
    )
    parser.add_argument(
        "--work-root",
        type=Path,
        default=None,
        help="where MiniStack's data dir goes (default /dev/shm if it has room, else TMPDIR)",
    )
    parser.add_argument("--keep-work-dir", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.manifests is None:
        args.manifests = QUICK_MANIFESTS if args.quick else FULL_MANIFESTS
    if args.agents is None:
        args.agents = 64 if args.quick else 256
    if args.quick:
        args.probe_requests = min(args.probe_requests, 5000)
    if args.manifests < 1 or args.concurrency < 1 or args.agents < 1 or args.boots < 1:
        raise SystemExit("--manifests, --concurrency, --agents and --boots must be >= 1")
    if args.blob_bytes < 64:
        raise SystemExit("--blob-bytes must be >= 64 (a frame is at least 56 bytes)")
    for name in AWS_ENV_TO_REMOVE:
        os.environ.pop(name, None)
    os.environ.update(dummy_aws_env())
    configure_logging(LoggingSettings(level="warning", format="console"))

    now_ns = time.time_ns()
    fleet = Fleet(
        manifests=args.manifests,
        agents=args.agents,
        boots=args.boots,
        blob_bytes=args.blob_bytes,
        first_ns=now_ns - 23 * HOUR_NS,
        span_ns=22 * HOUR_NS,
    )
    report = Report(
        command=".venv/bin/python -m bench.reconcile "
        + " ".join(sys.argv[1:] if argv is None else argv),
        args={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        fleet=fleet,
        seed=SeedResult(mode=args.seed),
        phases=[],
        damage={},
        started=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        loadavg_start=os.getloadavg(),
    )
    report.seed.work_root = str(args.work_root or default_work_root(fleet))
    work_dir = Path(tempfile.mkdtemp(prefix="lm-bench-reconcile-", dir=report.seed.work_root))
    print(f"work dir: {work_dir}", flush=True)
    try:
        uvloop.run(run(args, work_dir, report))
    finally:
        report.loadavg_end = os.getloadavg()
        if args.keep_work_dir:
            print(f"work dir kept: {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)
    report.print_table()
    markdown = report.markdown()
    if args.markdown is not None:
        args.markdown.write_text(markdown + "\n")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "command": report.command,
                    "started": report.started,
                    "fleet": dataclasses.asdict(fleet),
                    "seed": dataclasses.asdict(report.seed),
                    "damage": report.damage,
                    "phases": [dataclasses.asdict(p) for p in report.phases],
                    "ratio": report.verdict()[0],
                    "verdict": report.verdict()[1],
                    "ratio_verification_paused": report.verdict(PAUSED_PHASE)[0],
                    "loadavg": [report.loadavg_start, report.loadavg_end],
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
