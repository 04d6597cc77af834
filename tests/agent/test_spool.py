from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from agent.producer import BatchProducer
from agent.spool import ParkKind, Spool, SpoolFull, SpoolLocked, identity_of
from protocol.frame import decode_frame
from tests.agent.conftest import make_points

REPO = Path(__file__).resolve().parents[2]


def test_append_is_durable_and_reopens_identically(tmp_path: Path):
    directory = tmp_path / "spool"
    with Spool.open(directory) as spool:
        producer = BatchProducer(agent_id="a", spool=spool)
        entries = [producer.submit(make_points(n)) for n in (1, 3, 2)]
        assert [e.identity.seq_start for e in entries] == [0, 1, 4]
        assert [e.identity.seq_end for e in entries] == [0, 3, 5]
        assert list((directory / "tmp").iterdir()) == []
    with Spool.open(directory) as reopened:
        again = reopened.pending()
        assert [(e.name, e.identity, e.frame_sha256) for e in again] == [
            (e.name, e.identity, e.frame_sha256) for e in entries
        ]
        for entry in again:
            frame = entry.read()
            assert hashlib.sha256(frame).hexdigest() == entry.frame_sha256
            assert identity_of(frame) == entry.identity
        later = reopened.append(*BatchProducer(agent_id="a").frame(make_points(1)))
        assert later.name > again[-1].name  # numbering continues, names never reused


def test_limits_raise_spool_full_before_writing(tmp_path: Path):
    frame, identity = BatchProducer(agent_id="a").frame(make_points(4))
    with Spool.open(tmp_path / "s", max_pending_frames=2) as spool:
        spool.append(frame, identity)
        spool.append(frame, identity)
        with pytest.raises(SpoolFull):
            spool.append(frame, identity)
        assert len(list(spool.pending_dir.iterdir())) == 2
        spool.delete(spool.pending()[0])
        spool.append(frame, identity)  # space again after a delivery
    with Spool.open(tmp_path / "b", max_pending_bytes=2 * len(frame) + 1) as spool:
        spool.append(frame, identity)
        spool.append(frame, identity)
        with pytest.raises(SpoolFull):
            spool.append(frame, identity)
        assert spool.pending_bytes == 2 * len(frame)
        with pytest.raises(ValueError):
            spool.append(frame * 3, identity)


def test_spool_full_does_not_consume_the_sequence_range(tmp_path: Path):
    with Spool.open(tmp_path / "s", max_pending_frames=1) as spool:
        producer = BatchProducer(agent_id="a", spool=spool)
        first = producer.submit(make_points(2))
        with pytest.raises(SpoolFull):
            producer.submit(make_points(3))
        assert producer.next_seq == 2
        spool.delete(first)
        assert producer.submit(make_points(3)).identity.seq_start == 2


def test_second_open_is_refused(tmp_path: Path):
    with Spool.open(tmp_path / "s"):
        with pytest.raises(SpoolLocked):
            Spool.open(tmp_path / "s")
    Spool.open(tmp_path / "s").close()  # released on close


def test_park_moves_frame_with_sidecar(spool: Spool, producer: BatchProducer):
    entry = producer.submit(make_points(2))
    frame = entry.read()
    parked_path = spool.park(
        entry,
        ParkKind.CONFLICT,
        status=409,
        reason="identity_conflict",
        response={"error": "identity_conflict"},
    )
    assert parked_path.read_bytes() == frame and not entry.path.exists()
    assert spool.pending() == [] and spool.pending_count == 0 and spool.pending_bytes == 0
    sidecar = json.loads(parked_path.with_suffix(".json").read_text())
    assert sidecar["status"] == 409 and sidecar["reason"] == "identity_conflict"
    assert sidecar["boot_id"] == str(producer.boot_id) and sidecar["seq_end"] == 1


def test_recovery_cleans_tmp_orphans_and_parks_damaged_frames(tmp_path: Path):
    directory = tmp_path / "spool"
    with Spool.open(directory) as spool:
        producer = BatchProducer(agent_id="a", spool=spool)
        good = producer.submit(make_points(2))
        bad = producer.submit(make_points(2))
    (directory / "tmp" / "000000000009-abc.lmbatch.1.tmp").write_bytes(b"half a frame")
    (directory / "parked" / "poison" / "000000000007-aaaaaaaaaaaa.json").write_text("{}")
    damaged = bytearray(bad.path.read_bytes())
    damaged[-10] ^= 0xFF
    bad.path.write_bytes(bytes(damaged))
    with Spool.open(directory) as spool:
        assert [e.name for e in spool.pending()] == [good.name]
        assert list((directory / "tmp").iterdir()) == []
        (parked,) = spool.parked(ParkKind.POISON)
        assert parked.name == bad.name
        assert parked.sidecar["reason"] == "unreadable_in_spool"
        assert "crc32" in parked.sidecar["detail"]
        assert not (directory / "parked" / "poison" / "000000000007-aaaaaaaaaaaa.json").exists()
        # numbering continues past every name seen, parked ones included
        assert spool.append(*BatchProducer(agent_id="a").frame(make_points(1))).name > bad.name


def _start_writer(directory: Path, agent_id: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.agent.spool_writer", str(directory), agent_id, *extra],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _run_and_kill(directory: Path, agent_id: str, acks_wanted: int) -> tuple[str, list[dict]]:
    """Start a writer, read ``acks_wanted`` acks, SIGKILL it while it keeps appending."""
    child = _start_writer(directory, agent_id)
    assert child.stdout is not None
    boot_id = json.loads(child.stdout.readline())["boot_id"]
    acks = [json.loads(child.stdout.readline()) for _ in range(acks_wanted)]
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    # Whatever it announced before dying is an ack too (it was printed after submit).
    acks += [json.loads(line) for line in child.stdout.read().splitlines() if line.strip()]
    child.stdout.close()
    return boot_id, acks


def _assert_consistent(spool: Spool, acked: dict[str, dict]) -> None:
    entries = {e.name: e for e in spool.pending()}
    for name, ack in acked.items():
        entry = entries[name]  # every acknowledged frame survived
        assert entry.frame_sha256 == ack["sha"]
        assert (entry.identity.seq_start, entry.identity.seq_end) == (
            ack["seq_start"],
            ack["seq_end"],
        )
    seen: dict[tuple[uuid.UUID, int], str] = {}
    for entry in entries.values():
        frame = entry.read()
        decode_frame(frame)  # every visible frame is whole
        for seq in range(entry.identity.seq_start, entry.identity.seq_end + 1):
            key = (entry.identity.boot_id, seq)
            assert seen.setdefault(key, entry.frame_sha256) == entry.frame_sha256, key
    assert list(spool.tmp_dir.iterdir()) == []


def test_sigkill_mid_run_loses_no_acknowledged_frame(tmp_path: Path):
    directory = tmp_path / "spool"
    acked: dict[str, dict] = {}
    boots = []
    for _ in range(2):  # crash, restart as a new boot, crash again
        boot_id, acks = _run_and_kill(directory, "crash-agent", acks_wanted=25)
        boots.append(boot_id)
        acked.update((ack["name"], ack) for ack in acks)
    assert boots[0] != boots[1]  # a restart is a new boot: old seqs are never reused
    with Spool.open(directory) as spool:
        _assert_consistent(spool, acked)
        by_boot = {str(e.identity.boot_id) for e in spool.pending()}
        assert by_boot <= set(boots)
        first_boot = sorted(
            (e for e in spool.pending() if str(e.identity.boot_id) == boots[0]),
            key=lambda e: e.identity.seq_start,
        )
        # Under one boot the ranges are contiguous from 0: nothing skipped or doubled.
        expected_start = 0
        for entry in first_boot:
            assert entry.identity.seq_start == expected_start
            expected_start = entry.identity.seq_end + 1


def test_sigkill_between_fsync_and_rename_leaves_nothing_visible(tmp_path: Path):
    directory = tmp_path / "spool"
    child = _start_writer(directory, "crash-agent", "--die-before-rename", "6")
    out, _ = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    lines = [json.loads(line) for line in out.splitlines()]
    acks = {ack["name"]: ack for ack in lines[1:]}
    assert len(acks) == 5
    assert len(list((directory / "tmp").iterdir())) == 1  # the half-done append
    assert len(list((directory / "pending").iterdir())) == 5
    with Spool.open(directory) as spool:
        _assert_consistent(spool, acks)
        assert len(spool.pending()) == 5
