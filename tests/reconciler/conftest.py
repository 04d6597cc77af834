"""Reconciler test helpers: synthetic batches written the way a collector writes them
(raw blob + accepted manifest, and their rows in the index log through `IndexLogWriter`),
settings, contexts on a `ManualClock`, a request-counting store wrapper, the catalog's
contents, and ``lm-reconciler`` as a child process.

A synthetic batch's "frame" is arbitrary bytes (the reconciler never decodes frames, only
hashes them), so stores with thousands of batches are cheap to build. Nothing here writes
a per-object derived entry: the index is the log and the catalog (PROTOCOL §3.7).
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from config import GcSettings, ReconcilerSettings, Settings
from index import catalog
from index.log_writer import IndexLogWriter
from index.rows import IndexRow, accepted_row, blob_row, quarantine_row
from protocol import keys
from protocol.clock import Clock, ManualClock
from protocol.frame_encode import encode_frame, points_table
from protocol.records import AcceptedManifest, AuditRecord, IdentityConflict
from reconciler.context import ReconcilerContext, open_context
from reconciler.metrics import ReconcilerMetrics
from store.base import ObjectStore
from store.errors import NotFound
from store.memory import MemoryStore

T0_NS = 1_760_000_000_000_000_000  # 2025-10-09T08:53:20Z
HOUR_NS = 3600 * keys.NS_PER_S


@dataclass(frozen=True)
class Batch:
    manifest: AcceptedManifest
    frame: bytes

    @property
    def key(self) -> str:
        return self.manifest.manifest_key

    @property
    def sha(self) -> str:
        return self.manifest.frame_sha256


def batch_frame(agent_id: str, boot: int, seq_start: int, *, value: float = 1.0) -> bytes:
    """A valid frame of 10 points (the GC's proof reads a blob's identity from its header,
    PROTOCOL §3.5 rule 7); another ``value`` gives another frame of the same identity."""
    table = points_table(
        [T0_NS + i for i in range(10)], ["cpu"] * 10, [value + i for i in range(10)], [None] * 10
    )
    return encode_frame(
        agent_id=agent_id, boot_id=uuid.UUID(int=boot), seq_start=seq_start, points=table
    )


def make_batch(agent: int, seq: int, accepted_at_ns: int, *, boot: int = 1) -> Batch:
    frame = batch_frame(f"agent-{agent:03d}", boot, seq * 10)
    manifest = AcceptedManifest.of_frame(
        frame, accepted_at_unix_ns=accepted_at_ns, collector_id="collector-test"
    )
    return Batch(manifest, frame)


async def write_batch(store: ObjectStore, batch: Batch) -> None:
    """The raw blob and the accepted manifest: the two PUTs of an acknowledged batch."""
    await store.put(keys.raw_blob_key(batch.sha), batch.frame, if_none_match=True)
    await store.put(batch.key, batch.manifest.to_json(), if_none_match=True)


async def write_batches(
    store: ObjectStore,
    *,
    agents: int,
    per_agent: int,
    start_ns: int = T0_NS,
    step_ns: int = keys.NS_PER_S,
    first_agent: int = 0,
) -> list[Batch]:
    batches = []
    for agent in range(first_agent, first_agent + agents):
        for seq in range(per_agent):
            offset = (agent - first_agent) * per_agent + seq
            batch = make_batch(agent, seq, start_ns + offset * step_ns)
            await write_batch(store, batch)
            batches.append(batch)
    return batches


def make_conflict(batch: Batch, observed_at_ns: int) -> tuple[IdentityConflict, bytes]:
    manifest = batch.manifest
    frame = batch_frame(
        manifest.agent_id, uuid.UUID(manifest.boot_id).int, manifest.seq_start, value=-1.0
    )
    sha = hashlib.sha256(frame).hexdigest()
    conflict = IdentityConflict(
        agent_id=batch.manifest.agent_id,
        boot_id=batch.manifest.boot_id,
        seq_start=batch.manifest.seq_start,
        seq_end=batch.manifest.seq_end,
        accepted_manifest_key=batch.key,
        accepted_raw_blob_key=batch.manifest.raw_blob_key,
        accepted_frame_sha256=batch.sha,
        submitted_raw_blob_key=keys.raw_blob_key(sha),
        submitted_frame_sha256=sha,
        observed_at_unix_ns=observed_at_ns,
        collector_id="collector-test",
    )
    return conflict, frame


def conflict_of(
    accepted: AcceptedManifest,
    submitted_frame_sha256: str,
    *,
    accepted_raw_blob_key: str | None = None,
    observed_at_unix_ns: int = 1,
    collector_id: str = "c-1",
) -> IdentityConflict:
    """The quarantine record of ``accepted``'s identity for a twin hashing to
    ``submitted_frame_sha256``; its accepted side names ``accepted_raw_blob_key`` (by
    default the manifest's raw key)."""
    return IdentityConflict(
        agent_id=accepted.agent_id,
        boot_id=accepted.boot_id,
        seq_start=accepted.seq_start,
        seq_end=accepted.seq_end,
        accepted_manifest_key=accepted.manifest_key,
        accepted_raw_blob_key=accepted_raw_blob_key or accepted.raw_blob_key,
        accepted_frame_sha256=accepted.frame_sha256,
        submitted_raw_blob_key=keys.raw_blob_key(submitted_frame_sha256),
        submitted_frame_sha256=submitted_frame_sha256,
        observed_at_unix_ns=observed_at_unix_ns,
        collector_id=collector_id,
    )


async def write_conflict(store: ObjectStore, batch: Batch, observed_at_ns: int) -> IdentityConflict:
    """The submitted blob and the quarantine record of an identity conflict."""
    conflict, frame = make_conflict(batch, observed_at_ns)
    await store.put(conflict.submitted_raw_blob_key, frame, if_none_match=True)
    await store.put(conflict.quarantine_key, conflict.to_json(), if_none_match=True)
    return conflict


def log_rows_of(
    batches: Iterable[Batch] = (), conflicts: Iterable[IdentityConflict] = ()
) -> list[IndexRow]:
    """The rows collectors append for these: ``blob`` + ``accepted`` per batch, ``blob`` +
    ``quarantine`` per conflict."""
    rows: list[IndexRow] = []
    for batch in batches:
        rows.append(blob_row(batch.sha, batch.manifest.accepted_at_unix_ns))
        rows.append(accepted_row(batch.manifest))
    for conflict in conflicts:
        rows.append(blob_row(conflict.submitted_frame_sha256, conflict.observed_at_unix_ns))
        rows.append(quarantine_row(conflict))
    return rows


async def log_rows(
    store: ObjectStore,
    clock: Clock,
    batches: Iterable[Batch] = (),
    conflicts: Iterable[IdentityConflict] = (),
    *,
    rows: Iterable[IndexRow] = (),
    writer_id: str = "collector-test",
    seed: int = 3,
) -> list[str]:
    """Append the batches' and conflicts' rows (and ``rows``) to an `IndexLogWriter` and
    flush it, as a collector does: one segment named by its cut time. Returns the new segment
    keys."""
    before = await keys_under(store, keys.INDEX_LOG_PREFIX)
    writer = IndexLogWriter(store=store, clock=clock, rng=random.Random(seed), writer_id=writer_id)
    for row in [*log_rows_of(batches, conflicts), *rows]:
        assert writer.append(row)
    await writer.flush()
    assert writer.stats.segments_written >= 1 and writer.buffered == 0
    return sorted(await keys_under(store, keys.INDEX_LOG_PREFIX) - before)


async def catalog_rows(store: ObjectStore) -> dict[str, IndexRow]:
    """Every catalog row by key (the union of every file, a key counted once)."""
    found: dict[str, IndexRow] = {}
    async for info in catalog.list_all_files(store):
        for row in await catalog.read_file(store, info.key):
            found.setdefault(row.key, row)
    return found


async def catalog_keys(store: ObjectStore) -> set[str]:
    return set(await catalog_rows(store))


def make_settings(**reconciler: object) -> Settings:
    defaults: dict[str, object] = {
        "lease_ttl_s": 30.0,
        "loop_interval_s": 10.0,
        "lookback_s": 300.0,  # the default: a longer one hid segments sorting too early
        "verify_rate_per_s": 1000.0,
        "concurrency": 4,
    }
    return Settings(
        reconciler=ReconcilerSettings.model_validate({**defaults, **reconciler}),
        gc=GcSettings(enabled=False),
    )


def with_retry_horizon(settings: Settings, horizon_s: float) -> Settings:
    return settings.model_copy(
        update={"gc": settings.gc.model_copy(update={"retry_horizon_s": horizon_s})}
    )


async def context(
    store: ObjectStore,
    clock: ManualClock,
    *,
    owner: str = "reconciler-a",
    settings: Settings | None = None,
    seed: int = 1,
) -> ReconcilerContext:
    return await open_context(
        store,
        settings=settings or make_settings(),
        clock=clock,
        rng=random.Random(seed),
        metrics=ReconcilerMetrics(clock=clock),
        owner=owner,
    )


async def audits_until_a_verification_round_ends(
    ctx: ReconcilerContext, clock: ManualClock, *, max_audits: int = 100
) -> list[AuditRecord]:
    """Full audits, a minute apart, until one ends a round of blob verification (each
    audit moves verification on by at least one blob: `reconciler.audit.blob_verify`)."""
    from reconciler.audit.run import VERIFY_CURSOR, run_full_audit

    records = []
    for _ in range(max_audits):
        record = await run_full_audit(ctx)
        assert record.status == "completed"
        records.append(record)
        if record.cursors.get(VERIFY_CURSOR) == "":
            return records
        clock.advance(60)
    raise AssertionError(f"no verification round ended in {max_audits} audits")


async def keys_under(store: ObjectStore, prefix: str = "") -> set[str]:
    return {info.key async for info in store.list(prefix)}


@pytest.fixture
def clock() -> ManualClock:
    # A minute past T0: batches written from T0 on lie in this hour's past.
    return ManualClock(T0_NS + 60 * keys.NS_PER_S)


@pytest.fixture
async def memory_store(clock: ManualClock) -> AsyncIterator[MemoryStore]:
    store = MemoryStore(clock=clock)
    try:
        yield store
    finally:
        await store.close()


# --- the CLI as a child process ------------------------------------------------------------


def cli_env(store_dir: Path, **settings: str) -> dict[str, str]:
    """Environment for ``lm-reconciler`` on the fs store at ``store_dir`` (GC off: it is
    not what these tests are about)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LM_")}
    env.update(
        {
            "LM_STORE__URL": f"file://{store_dir}",
            "LM_GC__ENABLED": "false",
            "LM_METRICS__PORT": "0",
            "LM_LOGGING__FORMAT": "json",
            **settings,
        }
    )
    return env


def run_cli(
    *args: str, env: dict[str, str], timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def start_cli(*args: str, env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "reconciler", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def write_batch_files(root: Path, batch: Batch) -> None:
    """Like `write_batch`, straight into an fs store's directory (fast: no fsync)."""
    objects = {keys.raw_blob_key(batch.sha): batch.frame, batch.key: batch.manifest.to_json()}
    for key, body in objects.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)


async def finished_listing_ranges(
    store: ObjectStore, record: AuditRecord
) -> set[tuple[str, str | None]]:
    """The ranges of ``record``'s listing that have their final part, each as the LIST call
    that lists it from its start: ``(list prefix, lower bound)`` (`reconciler.audit.ranges`)."""
    from reconciler.audit.ranges import PLAN_NAME, parse_plan

    audit_dir = keys.audit_listing_prefix(record.started_at_unix_ns, record.audit_id)
    try:
        body, _etag = await store.get(audit_dir + PLAN_NAME)
    except NotFound:
        return set()
    ranges = {(r.kind, r.index): r for r in parse_plan(audit_dir + PLAN_NAME, body)}
    finished = set()
    async for info in store.list(audit_dir):
        kind, _, name = info.key.removeprefix(audit_dir).partition("/")
        if name.endswith("-final.parquet") and (kind, int(name[:5])) in ranges:
            key_range = ranges[(kind, int(name[:5]))]  # type: ignore[index]
            finished.add((key_range.list_prefix, key_range.lower))
    return finished
