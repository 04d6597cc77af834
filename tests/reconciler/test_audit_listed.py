"""Audits that list instead of probing: derived entries skipped only when listed, the cap's
fallback, blob existence from the listing, discovery in S3 key order, and SHA-256
verification on a cursor carried from audit to audit."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

from protocol import keys
from protocol.clock import ManualClock
from protocol.records import ProblemRecord
from reconciler.audit import VERIFY_CURSOR, run_full_audit
from reconciler.audit_records import create_audit, latest_audit
from reconciler.listed import ListedKeys
from reconciler.listing import groups
from reconciler.problems import ProblemBook, count_problems
from reconciler.verify import BlobVerifier
from store.base import ObjectInfo, ObjectStore
from store.memory import MemoryStore
from tests.reconciler.conftest import (
    audits_until_a_verification_round_ends,
    context,
    derived_keys_in,
    make_settings,
    write_batches,
)


class CountingStore:
    """Passes calls through, counting them by operation (puts by condition) and
    recording every listing's (prefix, start_after)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url
        self.calls: Counter[str] = Counter()
        self.gets: list[str] = []
        self.puts: list[str] = []
        self.heads: list[str] = []
        self.lists: list[tuple[str, str | None]] = []

    async def get(self, key: str) -> tuple[bytes, str]:
        self.calls["get"] += 1
        self.gets.append(key)
        return await self.inner.get(key)

    async def head(self, key: str) -> ObjectInfo:
        self.calls["head"] += 1
        self.heads.append(key)
        return await self.inner.head(key)

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        self.calls["put_if_none_match" if if_none_match else "put"] += 1
        self.puts.append(key)
        return await self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match)

    async def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        self.calls["list"] += 1
        self.lists.append((prefix, start_after))
        async for info in self.inner.list(prefix, start_after):
            yield info

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def close(self) -> None:
        await self.inner.close()


DERIVED_PREFIXES = (
    keys.ACCEPTED_BY_TIME_PREFIX,
    keys.ACCEPTED_BY_BLOB_PREFIX,
    keys.RAW_BLOBS_BY_TIME_PREFIX,
    keys.QUARANTINE_BY_BLOB_PREFIX,
)


def derived_puts(store: CountingStore) -> list[str]:
    return [k for k in store.puts if k.startswith(DERIVED_PREFIXES)]


async def test_nothing_to_repair_costs_one_get_per_manifest_and_no_probe(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    await write_batches(memory_store, agents=5, per_agent=7)
    counting = CountingStore(memory_store)
    ctx = await context(counting, clock, settings=make_settings(verify_rate_per_s=1e-3))

    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.manifests_seen == 35
    assert record.repaired == {} and record.problems == 0
    assert derived_puts(counting) == [] and counting.heads == []
    # One GET per manifest; besides, only the audit's own records and verified blobs.
    assert len([k for k in counting.gets if k.startswith(keys.ACCEPTED_PREFIX)]) == 35
    others = [k for k in counting.gets if not k.startswith(keys.ACCEPTED_PREFIX)]
    assert all(k.startswith((keys.RECONCILER_PREFIX, keys.RAW_BLOBS_PREFIX)) for k in others)


async def test_only_listed_keys_are_skipped_and_the_rest_are_created(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=3, per_agent=4)
    expected = await derived_keys_in(memory_store)
    gone = {
        batches[0].entry_key("accepted-by-blob"),
        batches[5].entry_key("accepted-by-time"),
        batches[11].entry_key("raw-blobs-by-time"),
    }
    for key in gone:
        await memory_store.delete(key)
    counting = CountingStore(memory_store)
    ctx = await context(counting, clock)

    record = await run_full_audit(ctx)

    assert record.status == "completed"
    assert sorted(derived_puts(counting)) == sorted(gone)  # exactly the unlisted ones
    assert sum(n for kind, n in record.repaired.items() if kind != "rollup-dirty") == 3
    assert await derived_keys_in(memory_store) == expected


async def test_a_key_is_present_only_if_that_exact_key_was_listed(
    memory_store: MemoryStore,
) -> None:
    near = [
        keys.ACCEPTED_BY_TIME_PREFIX + "date=2025-10-09/hour=08/a.json",
        keys.ACCEPTED_BY_TIME_PREFIX + "date=2025-10-09/hour=08/a-b.json",
        keys.ACCEPTED_BY_TIME_PREFIX + "date=2025-10-09/hour=08/a/b.json",
    ]
    await memory_store.put(near[1], b"{}")
    blob = keys.raw_blob_key("ab" * 32)
    await memory_store.put(blob, b"12345")
    listed = await ListedKeys.load(
        memory_store, cap=100, raw_blobs_by_time_from=keys.UtcHour.parse_iso("2025-10-09T08")
    )

    assert [listed.has_entry(k) for k in near] == [False, True, False]
    assert listed.has_blob(blob, 5) and not listed.has_blob(blob, 4)
    assert not listed.has_entry(blob)  # blobs and entries are separate sets


async def test_past_the_cap_the_audit_falls_back_to_if_none_match_creates(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=2, per_agent=5)
    expected = await derived_keys_in(memory_store)
    await memory_store.delete(batches[3].entry_key("accepted-by-time"))
    counting = CountingStore(memory_store)
    ctx = await context(counting, clock, settings=make_settings(audit_listed_keys_max=4))

    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.manifests_seen == 10
    assert record.repaired.get("accepted-by-time") == 1
    assert await derived_keys_in(memory_store) == expected
    # 4 of the 40 keys (30 entries, 10 blobs) were remembered: every other entry was
    # probed (412) or created, and every other blob HEADed.
    assert len(derived_puts(counting)) + len(counting.heads) == 40 - 4


async def test_listing_off_probes_every_entry_and_repairs_the_same(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=2, per_agent=3)
    expected = await derived_keys_in(memory_store)
    await memory_store.delete(batches[4].entry_key("accepted-by-blob"))
    counting = CountingStore(memory_store)
    ctx = await context(counting, clock, settings=make_settings(audit_listed_keys_max=0))

    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.repaired["accepted-by-blob"] == 1
    assert len(derived_puts(counting)) == 18
    assert await derived_keys_in(memory_store) == expected


async def test_missing_blob_is_found_from_the_listing_with_one_head(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=2, per_agent=4)
    blob_key = batches[6].manifest.raw_blob_key
    await memory_store.delete(blob_key)
    counting = CountingStore(memory_store)
    ctx = await context(counting, clock, settings=make_settings(verify_rate_per_s=1e-3))

    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.problems == 1
    assert counting.heads == [blob_key]  # the one not listed is confirmed; the rest, not
    body, _ = await memory_store.get(keys.problem_key("missing-blob", blob_key))
    assert batches[6].key in ProblemRecord.from_json(body).detail

    await memory_store.put(blob_key, batches[6].frame)
    clock.advance(60)
    again = await run_full_audit(ctx)
    assert again.problems == 0 and await count_problems(memory_store) == {}


async def test_a_blob_of_the_wrong_size_is_confirmed_by_head_and_recorded_corrupt(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=3)
    blob_key = batches[1].manifest.raw_blob_key
    await memory_store.put(blob_key, batches[1].frame + b"x")
    ctx = await context(memory_store, clock, settings=make_settings(verify_rate_per_s=1e-3))

    record = await run_full_audit(ctx)

    assert record.problems >= 1
    body, _ = await memory_store.get(keys.problem_key("corrupt-blob", blob_key))
    assert "manifest says" in ProblemRecord.from_json(body).detail


async def test_discovery_follows_s3_order_and_skips_past_large_groups(
    memory_store: MemoryStore,
) -> None:
    prefix = "p/"
    # '-' (0x2d) < '/' (0x2f) < '0' (0x30): "a-x/" and "a0/" sort around "a/".
    layout = {
        "a": 1,  # a whole key: its own group
        "a-x/": 2,
        "a/": 5,
        "a0/": 1,
        "b/": 3,
    }
    for group, count in layout.items():
        if group.endswith("/"):
            for i in range(count):
                await memory_store.put(f"{prefix}{group}{i}", b"")
        else:
            await memory_store.put(prefix + group, b"")

    found = [g async for g in groups(memory_store, prefix, depth=1, max_keys=3, keep_keys=True)]

    assert [g.prefix for g in found] == ["p/a", "p/a-x/", "p/a/", "p/a0/", "p/b/"]
    assert [None if g.keys is None else len(g.keys) for g in found] == [1, 2, None, 1, 3]
    # Resuming past a group never skips a neighbour that sorts between it and its PAST.
    after_whole = [
        g.prefix async for g in groups(memory_store, prefix, depth=1, start_after=found[0].past)
    ]
    assert after_whole == ["p/a-x/", "p/a/", "p/a0/", "p/b/"]
    after_a = [
        g.prefix async for g in groups(memory_store, prefix, depth=1, start_after=found[2].past)
    ]
    assert after_a == ["p/a0/", "p/b/"]


async def test_groups_larger_than_a_page_are_listed_by_their_worker(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    """One agent with more manifests than discovery hands over, among small ones."""
    await write_batches(memory_store, agents=1, per_agent=1030, derived_entries=False)
    ctx = await context(memory_store, clock, settings=make_settings(verify_rate_per_s=1e-3))

    record = await run_full_audit(ctx)

    assert record.status == "completed" and record.manifests_seen == 1030
    assert record.repaired["accepted-by-blob"] == 1030


# --- verification --------------------------------------------------------------------


async def test_verifier_records_corrupt_blobs_naming_the_manifest_and_resumes_from_its_cursor(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=2, per_agent=10)
    by_key = sorted(batches, key=lambda b: b.manifest.raw_blob_key)
    corrupt_early, corrupt_late = by_key[2], by_key[15]
    for batch in (corrupt_early, corrupt_late):
        await memory_store.put(batch.manifest.raw_blob_key, bytes(reversed(batch.frame)))
    ctx = await context(memory_store, clock)
    problems = ProblemBook(ctx)
    await problems.load()
    cursor = by_key[9].manifest.raw_blob_key

    verifier = BlobVerifier(ctx, problems, cursor=cursor, limit=asyncio.Semaphore(2))
    await verifier.run()

    assert verifier.verified == 10 and verifier.problems == 1  # only keys after the cursor
    assert verifier.round_complete and verifier.cursor == ""
    late_key = corrupt_late.manifest.raw_blob_key
    assert await count_problems(memory_store) == {"corrupt-blob": 1}
    body, _ = await memory_store.get(keys.problem_key("corrupt-blob", late_key))
    detail = ProblemRecord.from_json(body).detail
    assert "hashes to" in detail and corrupt_late.key in detail

    await memory_store.put(late_key, corrupt_late.frame)  # repaired by hand
    again = BlobVerifier(ctx, problems, cursor="", limit=asyncio.Semaphore(2))
    await again.run()
    assert again.verified == 20 and again.problems == 1
    assert await count_problems(memory_store) == {"corrupt-blob": 1}  # early one; late resolved
    await memory_store.get(keys.problem_key("corrupt-blob", corrupt_early.manifest.raw_blob_key))


async def test_audits_carry_the_verification_cursor_and_a_corrupt_blob_is_found_within_a_round(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=3, per_agent=6)
    victim = batches[7]
    await memory_store.put(victim.manifest.raw_blob_key, bytes(reversed(victim.frame)))
    counting = CountingStore(memory_store)
    ctx = await context(counting, clock)
    # A previous audit stopped verifying just after the first blob.
    first_blob = min(b.manifest.raw_blob_key for b in batches)
    previous = (await run_full_audit(ctx)).model_copy(
        update={"audit_id": "0" * 16, "started_at_unix_ns": clock.now_ns() + 1}
    )
    previous = previous.model_copy(update={"cursors": {VERIFY_CURSOR: first_blob}})
    await create_audit(ctx, previous)
    counting.lists.clear()
    clock.advance(60)

    records = await audits_until_a_verification_round_ends(ctx, clock)

    assert all(VERIFY_CURSOR in r.cursors for r in records)
    verify_lists = [after for prefix, after in counting.lists if prefix == keys.RAW_BLOBS_PREFIX]
    assert verify_lists[0] == first_blob  # the first audit resumed where the last one stopped
    # Each audit's verification starts where the previous one's stopped.
    assert verify_lists[1 : len(records)] == [r.cursors[VERIFY_CURSOR] for r in records[:-1]]
    assert await count_problems(memory_store) == {"corrupt-blob": 1}
    assert (await latest_audit(memory_store)) == records[-1]


async def test_every_audit_moves_verification_on_even_when_its_walk_is_instant(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    batches = await write_batches(memory_store, agents=1, per_agent=5)
    ctx = await context(memory_store, clock, settings=make_settings(verify_rate_per_s=1e-3))

    records = await audits_until_a_verification_round_ends(ctx, clock)

    assert len(records) <= len(batches) + 1
    cursors = [r.cursors[VERIFY_CURSOR] for r in records]
    assert cursors[:-1] == sorted(cursors[:-1]) and all(cursors[:-1]) and cursors[-1] == ""
