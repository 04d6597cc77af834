"""Local spool mode (PROTOCOL §3.4): durable before the answer, landed by the protocol later."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from chaos.faulty_store import Fault, FaultyStore
from collector.accept import BatchAcceptor
from collector.launch import start_collector
from collector.local_spool.lander import SpoolLander
from collector.local_spool.spool import LocalSpool, SpoolFull
from index.log_writer import IndexLogWriter
from protocol import keys, records
from protocol.clock import ManualClock
from protocol.frame_encode import encode_frame, points_table
from store.errors import NotFound, Unavailable
from store.fs import FileSystemStore
from store.memory import MemoryStore
from store.retry import Backoff

BOOT = uuid.UUID("0b5e7a3e-1d2b-4c3a-9e8f-0123456789ab")


def frame(seq: int, value: float = 1.0, agent: str = "spool-agent") -> bytes:
    points = points_table([1_763_719_200_000_000_000 + seq], ["m"], [value], [None])
    return encode_frame(agent_id=agent, boot_id=BOOT, seq_start=seq, points=points)


def identity(seq: int) -> keys.BatchIdentity:
    return keys.BatchIdentity("spool-agent", BOOT, seq, seq)


def sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def open_spool(directory: Path, max_pending_bytes: int = 1 << 20) -> LocalSpool:
    return LocalSpool(
        directory, max_pending_bytes=max_pending_bytes, retry_horizon_s=3600.0, max_landed=1000
    )


def lander_for(spool: LocalSpool, store: object) -> SpoolLander:
    clock = ManualClock()
    acceptor = BatchAcceptor(
        store=store,  # type: ignore[arg-type]
        collector_id="spool-test",
        clock=clock,
        rng=random.Random(1),
        index_log=IndexLogWriter(store=store, clock=clock, rng=random.Random(2), writer_id="s"),  # type: ignore[arg-type]
        budget_s=1.0,
        backoff=Backoff(attempts=2, base_s=0.001, cap_s=0.002),
    )
    return SpoolLander(
        spool=spool,
        acceptor=acceptor,
        store=store,  # type: ignore[arg-type]
        clock=clock,
        interval_s=1.0,
    )


async def test_spool_answers_new_duplicate_and_conflict_from_local_state(tmp_path: Path) -> None:
    spool = open_spool(tmp_path)
    first, other = frame(1), frame(1, value=2.0)
    assert (await spool.add(identity(1), sha(first), first)).duplicate is False
    assert (await spool.add(identity(1), sha(first), first)).duplicate is True
    answer = await spool.add(identity(1), sha(other), other)
    assert answer.conflict_sha256 == sha(first)
    assert [p.read_bytes() for p in spool.pending()] == [first, other]  # acknowledgement order
    # The frame answered 409 stays refused when it is sent again (before: 200 duplicate).
    assert (await spool.add(identity(1), sha(other), other)).conflict_sha256 == sha(first)
    assert spool.frames == 2  # the conflicting frame is kept (once) to be quarantined


async def test_spool_refuses_past_its_bound_and_writes_nothing(tmp_path: Path) -> None:
    body = frame(1)
    spool = open_spool(tmp_path, len(body) + 10)
    await spool.add(identity(1), sha(body), body)
    with pytest.raises(SpoolFull):
        await spool.add(identity(2), sha(frame(2)), frame(2))
    assert len(spool.pending()) == 1


async def test_lander_accepts_quarantines_and_empties_the_spool(tmp_path: Path) -> None:
    store = MemoryStore()
    spool = open_spool(tmp_path)
    for seq in range(5):
        await spool.add(identity(seq), sha(frame(seq)), frame(seq))
    conflicting = frame(3, value=9.0)
    await spool.add(identity(3), sha(conflicting), conflicting)
    report = await lander_for(spool, store).land_once()
    assert (report.landed, report.conflicts, report.deferred) == (5, 1, 0)
    assert spool.pending() == []
    for seq in range(5):
        await store.head(keys.accepted_manifest_key(identity(seq)))
    quarantined = [info.key async for info in store.list(keys.QUARANTINE_PREFIX)]
    assert len(quarantined) == 1


async def test_store_outage_defers_landing_and_a_new_process_lands_the_rest(tmp_path: Path) -> None:
    inner = MemoryStore()
    faulty = FaultyStore(inner, rates={"put_if_none_match": {Fault.UNAVAILABLE: 1.0}})
    spool = open_spool(tmp_path)
    for seq in range(3):
        await spool.add(identity(seq), sha(frame(seq)), frame(seq))
    report = await lander_for(spool, faulty).land_once()
    assert report.deferred == 1 and len(spool.pending()) == 3
    with pytest.raises(NotFound):
        await inner.head(keys.accepted_manifest_key(identity(0)))
    reopened = open_spool(tmp_path)  # as after a restart
    assert (await lander_for(reopened, inner).land_once()).landed == 3


def post(url: str, body: bytes) -> tuple[int, dict[str, object]]:
    request = urllib.request.Request(
        f"{url}/v1/batches", data=body, headers={"Content-Type": "application/x-lmbatch"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


async def test_acknowledged_spooled_batches_survive_kill_9_and_land_after_restart(
    tmp_path: Path,
) -> None:
    store_dir, spool_dir = tmp_path / "store", tmp_path / "spool"
    env = {
        "LM_STORE__URL": f"file://{store_dir}",
        "LM_INGEST__ACCEPTANCE": "local_spool",
        "LM_INGEST__SPOOL_DIR": str(spool_dir),
        "LM_INGEST__OBJECT_LANDING_INTERVAL_MS": "3600000",  # no landing until the restart
        "LM_METRICS__ENABLED": "false",
    }
    collector = start_collector(work_dir=tmp_path / "logs", name="spool-1", env=env)
    try:
        answers = [post(collector.url, frame(seq)) for seq in range(20)]
    finally:
        collector.kill()
    assert all(status == 200 and body["spooled"] is True for status, body in answers)
    assert not store_dir.joinpath("accepted").exists()  # nothing landed before the crash
    env["LM_INGEST__OBJECT_LANDING_INTERVAL_MS"] = "50"
    restarted = start_collector(work_dir=tmp_path / "logs", name="spool-2", env=env)
    try:
        store = FileSystemStore(store_dir)
        for _ in range(200):  # poll (bounded) for the first landing round to finish
            if len([i async for i in store.list(keys.ACCEPTED_PREFIX)]) == 20:
                break
            await asyncio.sleep(0.05)
    finally:
        assert restarted.stop() == 0
    for seq, (_, body) in enumerate(answers):
        manifest = records.AcceptedManifest.from_json(
            (await store.get(keys.accepted_manifest_key(identity(seq))))[0]
        )
        assert manifest.frame_sha256 == body["frame_sha256"]
    assert list((spool_dir / "pending").iterdir()) == []


def test_local_spool_refuses_more_than_one_worker(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "LM_STORE__URL": f"file://{tmp_path / 'store'}",
        "LM_INGEST__ACCEPTANCE": "local_spool",
        "LM_HTTP__PORT": "18999",
    }
    done = subprocess.run(
        [sys.executable, "-m", "collector", "serve", "--workers", "2"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "local_spool" in done.stderr and "--workers 2" in done.stderr


async def test_a_128_byte_agent_id_is_spooled_and_landed(tmp_path: Path) -> None:
    """Spool file names keep PROTOCOL §3's segment rule (before: ENAMETOOLONG from ~44
    bytes), and the frame lands under the h- manifest key."""
    agent = "long-agent-".ljust(128, "z")
    body = frame(1, agent=agent)
    long_identity = keys.BatchIdentity(agent, BOOT, 1, 1)
    spool = open_spool(tmp_path / "spool")
    assert not (await spool.add(long_identity, sha(body), body)).duplicate
    assert (await spool.add(long_identity, sha(body), body)).duplicate
    other = frame(1, value=5.0, agent=agent)
    assert (await spool.add(long_identity, sha(other), other)).conflict_sha256 == sha(body)
    assert all(len(p.name.encode()) <= 255 for p in spool.pending())
    store = FileSystemStore(tmp_path / "store")
    report = await lander_for(spool, store).land_once()
    assert (report.landed, report.conflicts, report.deferred) == (1, 1, 0)
    assert spool.pending() == [] and spool.frames == 0
    manifest = records.AcceptedManifest.from_json(
        (await store.get(keys.accepted_manifest_key(long_identity)))[0]
    )
    assert manifest.agent_id == agent


class QuarantineRefusingStore(MemoryStore):
    """Refuses every quarantine-record write while ``refusing`` (a store outage that hits
    exactly the write that makes a landed conflict known)."""

    refusing = True

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        if self.refusing and key.startswith(keys.QUARANTINE_PREFIX):
            raise Unavailable("put", key, "injected outage")
        return await super().put(key, body, if_none_match=if_none_match, if_match=if_match)


async def test_a_landed_conflict_keeps_its_frame_until_the_quarantine_record_exists(
    tmp_path: Path,
) -> None:
    """PROTOCOL §3.4: the agent was told 200, so the spooled frame is the only trace of
    the conflict; it is removed only once the quarantine record exists."""
    store = QuarantineRefusingStore()
    accepted, conflicting = frame(1), frame(1, value=7.0)
    elsewhere = open_spool(tmp_path / "elsewhere")  # another writer of the same store
    await elsewhere.add(identity(1), sha(accepted), accepted)
    assert (await lander_for(elsewhere, store).land_once()).landed == 1
    # The store held the identity before this spool did (PROTOCOL §3.4's one limit): the
    # spool answers 200, and the conflict is found when landing.
    spool = open_spool(tmp_path / "spool")
    assert (await spool.add(identity(1), sha(conflicting), conflicting)).conflict_sha256 is None

    report = await lander_for(spool, store).land_once()
    assert (report.conflicts, report.deferred) == (0, 1)
    assert [p.read_bytes() for p in spool.pending()] == [conflicting]
    assert [i async for i in store.list(keys.QUARANTINE_PREFIX)] == []

    store.refusing = False
    report = await lander_for(spool, store).land_once()
    assert (report.conflicts, report.deferred) == (1, 0)
    assert spool.pending() == []
    quarantined = [i.key async for i in store.list(keys.QUARANTINE_PREFIX)]
    assert quarantined == [keys.quarantine_key(identity(1), sha(conflicting))]


async def test_admission_reads_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PROTOCOL §3.4: admission cost does not grow with the spooled files. Before, every
    add globbed the whole pending directory under the lock (104 ms at 50k files)."""
    spool = open_spool(tmp_path, 1 << 30)
    for seq in range(60):
        await spool.add(identity(seq), sha(frame(seq)), frame(seq))
    reopened = open_spool(tmp_path, 1 << 30)  # knows them after a restart
    scans: list[str] = []
    real_glob, real_iterdir, real_scandir, real_listdir = (
        Path.glob,
        Path.iterdir,
        os.scandir,
        os.listdir,
    )

    def counting(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            scans.append(name)
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(Path, "glob", counting("glob", real_glob))
    monkeypatch.setattr(Path, "iterdir", counting("iterdir", real_iterdir))
    monkeypatch.setattr(os, "scandir", counting("scandir", real_scandir))
    monkeypatch.setattr(os, "listdir", counting("listdir", real_listdir))

    assert (await reopened.add(identity(7), sha(frame(7)), frame(7))).duplicate
    other = frame(7, value=3.0)
    assert (await reopened.add(identity(7), sha(other), other)).conflict_sha256 == sha(frame(7))
    assert not (await reopened.add(identity(400), sha(frame(400)), frame(400))).duplicate
    assert scans == []
    assert reopened.frames == 62


async def test_a_request_cancelled_during_the_durable_write_keeps_the_spool_exact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 item 14. Before: cancelling the handler while the write ran in its thread
    released the lock and skipped the bookkeeping, so the written file was not counted
    and not known (a conflicting frame was answered 200), and landing it drove the
    counters below zero."""
    spool = open_spool(tmp_path)
    writing, release, written = threading.Event(), threading.Event(), threading.Event()
    real_write = spool._write_durably

    def held_write(*args: Any) -> None:
        writing.set()
        release.wait(10)
        real_write(*args)
        written.set()

    monkeypatch.setattr(spool, "_write_durably", held_write)
    body, other = frame(1), frame(1, value=2.0)
    handler = asyncio.create_task(spool.add(identity(1), sha(body), body))
    assert await asyncio.to_thread(writing.wait, 10)
    handler.cancel()  # the client went away mid-write
    with pytest.raises(asyncio.CancelledError):
        await handler
    release.set()
    assert await asyncio.to_thread(written.wait, 10)  # the file is in pending/
    answer = await spool.add(identity(1), sha(other), other)
    assert answer.conflict_sha256 == sha(body)
    assert spool.frames == len(list(spool.pending_dir.iterdir())) == 2
    assert spool.pending_bytes == len(body) + len(other)
    report = await lander_for(spool, MemoryStore()).land_once()
    assert (report.landed, report.conflicts) == (1, 1)
    assert (spool.frames, spool.pending_bytes, spool.pending()) == (0, 0, [])
