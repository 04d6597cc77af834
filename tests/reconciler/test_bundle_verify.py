"""SHA verification of bundles (PROTOCOL §3.10, `reconciler.bundle_verify`): its own cursor
over ``raw-bundles/v1/``, paced by bytes at ``[reconciler] verify_bytes_per_s`` on the
injected clock, a failing bundle a ``corrupt-blob`` problem and a repaired one resolved;
and a full audit runs it and carries its cursor."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from config import ReconcilerSettings
from protocol import bundle as bd
from protocol import keys
from protocol.clock import ManualClock
from protocol.frame_encode import encode_frame, points_table
from reconciler.audit.run import run_full_audit
from reconciler.bundle_verify import BUNDLE_VERIFY_CURSOR, BundleVerifier, ByteRate
from reconciler.problems import ProblemBook, count_problems
from store.counting import CountingStore
from store.memory import MemoryStore
from tests.reconciler.conftest import context, make_settings
from tests.reconciler.test_gc_bundles import BOOT

NS = keys.NS_PER_S


def bundle_of(n: int) -> bd.EncodedBundle:
    frames = [
        encode_frame(
            agent_id="agent-v",
            boot_id=BOOT,
            seq_start=10 * n + i,
            points=points_table([1_760_000_000 * NS + i], ["cpu"], [float(n)], [None]),
        )
        for i in range(3)
    ]
    return bd.encode_bundle(frames)


async def test_bundles_are_verified_from_the_cursor_at_the_byte_rate(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    bundles = sorted((bundle_of(n) for n in range(6)), key=lambda b: b.key)
    for b in bundles:
        await memory_store.put(b.key, b.data)
    damaged = bundles[4]
    broken = bytearray(damaged.data)
    broken[70] ^= 0xFF  # inside frame 0: its CRC (and the bundle's hash) fail
    await memory_store.put(damaged.key, bytes(broken))
    size = len(bundles[0].data)
    rate = 2 * size  # two bundles a second
    store = CountingStore(memory_store)
    ctx = await context(store, clock, settings=make_settings(verify_bytes_per_s=rate))
    problems = ProblemBook(ctx)
    verifier = BundleVerifier.of(ctx, problems, cursor=bundles[0].key)
    started = clock.monotonic()
    await verifier.run()
    # Only keys after the cursor: 5 read (one GET each, one LIST page), one corrupt.
    assert store.count("get", keys.RAW_BUNDLES_PREFIX) == 5
    assert store.count("list", keys.RAW_BUNDLES_PREFIX) == 1
    assert verifier.verified == 4 and verifier.problems == 1
    assert verifier.round_complete and verifier.cursor == ""
    assert verifier.bytes_read == sum(len(b.data) for b in bundles[1:])
    # A second's worth up front, then the rest at the rate: ~ (5 - 2) / 2 s.
    assert 1.4 <= clock.monotonic() - started <= 1.6
    assert await count_problems(memory_store) == {"corrupt-blob": 1}
    assert await memory_store.head(keys.problem_key("corrupt-blob", damaged.key))

    await memory_store.put(damaged.key, damaged.data)  # repaired by hand
    again = BundleVerifier.of(ctx, ProblemBook(ctx), cursor="")
    await again.run()
    assert again.verified == 6 and again.problems == 0
    assert await count_problems(memory_store) == {}


async def test_a_bundle_listed_larger_than_the_largest_is_a_problem_without_a_read(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    b = bundle_of(1)
    await memory_store.put(b.key, b.data)
    store = CountingStore(memory_store)
    ctx = await context(store, clock)
    verifier = BundleVerifier(ctx, ProblemBook(ctx), cursor="", max_bundle_bytes=len(b.data) - 1)
    await verifier.run()
    assert verifier.problems == 1 and store.count("get", keys.RAW_BUNDLES_PREFIX) == 0


async def test_a_full_audit_verifies_bundles_and_keeps_their_cursor(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    b = bundle_of(2)
    await memory_store.put(b.key, b.data)
    ctx = await context(memory_store, clock)
    record = await run_full_audit(ctx)
    assert record.status == "completed"
    assert record.cursors.get(BUNDLE_VERIFY_CURSOR) == ""  # a round completed: from the start


async def test_the_byte_rate_waits_for_an_object_larger_than_a_second() -> None:
    clock = ManualClock()
    rate = ByteRate(rate_per_s=100.0, clock=clock)
    await rate.take(100)  # the first second's worth
    start = clock.monotonic()
    await rate.take(300)
    assert clock.monotonic() - start == pytest.approx(3.0)


def test_verify_bytes_per_s_is_validated() -> None:
    assert ReconcilerSettings().verify_bytes_per_s == 16 * 1024 * 1024
    for bad in (0, -1, 1023, 11 * 1024**3):
        with pytest.raises(ValidationError):
            ReconcilerSettings(verify_bytes_per_s=bad)
