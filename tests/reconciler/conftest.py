"""Reconciler test helpers: synthetic accepted batches written the way a collector writes
them, settings, contexts on a `ManualClock`, and a store listing snapshot.

A synthetic batch's "frame" is arbitrary bytes (the reconciler never decodes frames, only
hashes them), so stores with thousands of batches are cheap to build.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from config import GcSettings, ReconcilerSettings, Settings
from protocol import derived, keys
from protocol.clock import ManualClock
from protocol.records import AcceptedManifest, AuditRecord, IdentityConflict
from reconciler.context import ReconcilerContext, open_context
from reconciler.metrics import ReconcilerMetrics
from store.base import ObjectStore
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

    @property
    def derived_keys(self) -> set[str]:
        return {e.key for e in derived.manifest_backfill(self.manifest)}

    def entry_key(self, kind: str) -> str:
        return next(e.key for e in derived.manifest_backfill(self.manifest) if e.kind == kind)


def make_batch(agent: int, seq: int, accepted_at_ns: int, *, boot: int = 1) -> Batch:
    frame = f"frame agent={agent} boot={boot} seq={seq} ".encode() * 3
    sha = hashlib.sha256(frame).hexdigest()
    manifest = AcceptedManifest(
        agent_id=f"agent-{agent:03d}",
        boot_id=str(uuid.UUID(int=boot)),
        seq_start=seq * 10,
        seq_end=seq * 10 + 9,
        record_count=10,
        frame_sha256=sha,
        frame_bytes=len(frame),
        raw_blob_key=keys.raw_blob_key(sha),
        accepted_at_unix_ns=accepted_at_ns,
        collector_id="collector-test",
    )
    return Batch(manifest, frame)


async def write_batch(store: ObjectStore, batch: Batch, *, derived_entries: bool = True) -> None:
    """Blob, manifest and (unless told not to) every derived entry, as a collector would."""
    await store.put(keys.raw_blob_key(batch.sha), batch.frame, if_none_match=True)
    await store.put(batch.key, batch.manifest.to_json(), if_none_match=True)
    if derived_entries:
        for entry in derived.manifest_backfill(batch.manifest):
            await store.put(entry.key, entry.body, if_none_match=True)


async def write_batches(
    store: ObjectStore,
    *,
    agents: int,
    per_agent: int,
    start_ns: int = T0_NS,
    step_ns: int = keys.NS_PER_S,
    derived_entries: bool = True,
) -> list[Batch]:
    batches = []
    for agent in range(agents):
        for seq in range(per_agent):
            batch = make_batch(agent, seq, start_ns + (agent * per_agent + seq) * step_ns)
            await write_batch(store, batch, derived_entries=derived_entries)
            batches.append(batch)
    return batches


def make_conflict(batch: Batch, observed_at_ns: int) -> tuple[IdentityConflict, bytes]:
    frame = b"a different frame under the same identity " * 2
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


async def write_conflict(
    store: ObjectStore, batch: Batch, observed_at_ns: int, *, derived_entries: bool = True
) -> IdentityConflict:
    conflict, frame = make_conflict(batch, observed_at_ns)
    await store.put(conflict.submitted_raw_blob_key, frame, if_none_match=True)
    await store.put(conflict.quarantine_key, conflict.to_json(), if_none_match=True)
    if derived_entries:
        for entry in derived.quarantine_backfill(conflict):
            await store.put(entry.key, entry.body, if_none_match=True)
    return conflict


def make_settings(**reconciler: object) -> Settings:
    defaults: dict[str, object] = {
        "lease_ttl_s": 30.0,
        "loop_interval_s": 10.0,
        "lookback_s": 7200.0,
        "verify_rate_per_s": 1000.0,
        "concurrency": 4,
    }
    return Settings(
        reconciler=ReconcilerSettings.model_validate({**defaults, **reconciler}),
        gc=GcSettings(enabled=False),
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
    audit moves verification on by at least one blob: `reconciler.verify`)."""
    from reconciler.audit import VERIFY_CURSOR, run_full_audit

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


async def derived_keys_in(store: ObjectStore) -> set[str]:
    found: set[str] = set()
    for prefix in (
        keys.ACCEPTED_BY_TIME_PREFIX,
        keys.ACCEPTED_BY_BLOB_PREFIX,
        keys.RAW_BLOBS_BY_TIME_PREFIX,
        keys.QUARANTINE_BY_BLOB_PREFIX,
    ):
        found |= await keys_under(store, prefix)
    return found


@pytest.fixture
def clock() -> ManualClock:
    # Half past the hour of T0 plus a little: batches written from T0 land in this hour.
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
    not what these tests are about, and it may not be installed)."""
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


def write_batch_files(root: Path, batch: Batch, *, derived_entries: bool = True) -> None:
    """Like `write_batch`, straight into an fs store's directory (fast: no fsync)."""
    objects = {keys.raw_blob_key(batch.sha): batch.frame, batch.key: batch.manifest.to_json()}
    if derived_entries:
        objects.update({e.key: e.body for e in derived.manifest_backfill(batch.manifest)})
    for key, body in objects.items():
        path = root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
