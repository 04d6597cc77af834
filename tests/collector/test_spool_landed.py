"""The local spool's landed memory and its file names (PROTOCOL §3.4): bounded by the
retry horizon and a count, durable, and names that keep the acknowledgement order."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from collector.local_spool.landed import FILE_NAME, LandedMemory, LandedMemoryError
from collector.local_spool.spool import LocalSpool, file_name
from protocol import keys
from store.memory import MemoryStore
from tests.collector.test_spool import BOOT, frame, identity, lander_for, sha

HOUR_NS = 3600 * keys.NS_PER_S


def open_spool(directory: Path, max_landed: int = 1000) -> LocalSpool:
    return LocalSpool(
        directory, max_pending_bytes=1 << 20, retry_horizon_s=3600.0, max_landed=max_landed
    )


def test_the_memory_forgets_past_the_horizon_and_past_its_bound(tmp_path: Path) -> None:
    memory = LandedMemory(tmp_path, horizon_s=3600.0, max_entries=3)
    a, b = "a" * 64, "b" * 64
    for seq in range(4):
        memory.remember(identity(seq).key_identity, a, now_ns=seq * HOUR_NS // 4)
    memory.remember(identity(1).key_identity, b, now_ns=HOUR_NS)  # landed again: moves last
    assert memory.prune(now_ns=HOUR_NS) == 1  # four rows, three allowed: the oldest goes
    assert [memory.get(identity(s).key_identity) for s in range(4)] == [None, b, a, a]
    assert memory.prune(now_ns=HOUR_NS + 3 * HOUR_NS // 4 + 1) == 2  # seq 2, 3 are past it
    assert [memory.get(identity(s).key_identity) for s in range(4)] == [None, b, None, None]
    memory.close()
    reopened = LandedMemory(tmp_path, horizon_s=3600.0, max_entries=3)  # durable
    assert reopened.get(identity(1).key_identity) == b
    reopened.close()


def test_either_agent_form_names_the_same_row(tmp_path: Path) -> None:
    agent = "x" * 128
    whole = keys.BatchIdentity(agent, BOOT, 1, 1)
    digest_only = keys.KeyIdentity(hashlib.sha256(agent.encode()).hexdigest(), BOOT, 1, 1)
    memory = LandedMemory(tmp_path, horizon_s=60.0, max_entries=10)
    memory.remember(whole.key_identity, "c" * 64, now_ns=0)
    assert memory.get(digest_only) == "c" * 64
    memory.close()


def test_an_unreadable_memory_stops_start_up_naming_the_file(tmp_path: Path) -> None:
    (tmp_path / FILE_NAME).write_bytes(b"not a database" * 100)
    with pytest.raises(LandedMemoryError, match=FILE_NAME):
        open_spool(tmp_path)


async def test_a_landed_identity_past_the_horizon_is_new_again(tmp_path: Path) -> None:
    spool = open_spool(tmp_path)
    first, other = frame(1), frame(1, value=2.0)
    await spool.add(identity(1), sha(first), first)
    lander = lander_for(spool, MemoryStore())
    assert (await lander.land_once()).landed == 1
    assert (await spool.add(identity(1), sha(first), first)).duplicate
    assert (await spool.add(identity(1), sha(other), other)).conflict_sha256 == sha(first)
    assert (await lander.land_once()).conflicts == 1
    spool.landed_memory.prune(now_ns=lander._clock.now_ns() + 2 * HOUR_NS)
    # No agent retries past the horizon; what it sends then is decided when it lands.
    assert (await spool.add(identity(1), sha(other), other)).conflict_sha256 is None


async def test_names_keep_the_segment_rule_and_the_acknowledgement_order(tmp_path: Path) -> None:
    spool = open_spool(tmp_path)
    long_agent = keys.BatchIdentity("z" * 128, BOOT, 2**64 - 1, 2**64 - 1)
    name = file_name(long_agent, 10**20 - 1, "f" * 64)
    assert len(name.encode()) <= keys.SEGMENT_MAX_BYTES
    # A file spooled before names carried the sequence lands first; a stray file is set
    # aside for an operator, not landed and not counted.
    legacy = keys.identity_name(identity(9), f".{sha(frame(9))}.lmbatch")
    (spool.pending_dir / legacy).write_bytes(frame(9))
    (spool.pending_dir / "stray.lmbatch").write_bytes(b"x")
    for seq in (5, 3, 4):
        await spool.add(identity(seq), sha(frame(seq)), frame(seq))
    await spool.close()
    reopened = open_spool(tmp_path)
    assert [p.read_bytes() for p in reopened.pending()] == [frame(s) for s in (9, 5, 3, 4)]
    assert [p.name for p in reopened.unreadable_dir.iterdir()] == ["stray.lmbatch"]
    await reopened.add(identity(1), sha(frame(1)), frame(1))
    assert reopened.pending()[-1].read_bytes() == frame(1)  # numbering continues
    assert reopened.pending()[-1].name.endswith(f".{3:020d}.{sha(frame(1))}.lmbatch")
