"""GC rule 7 for a bundle (PROTOCOL §3.5, §3.10; issue 33 item 6), on a memory store with
every request counted: `reconciler.gc.proof.TargetedProof` on a raw object key.

A bundle is proven only when it checks whole (frames tiled from offset 0, equal to the
index, CRC and ``frame_sha256``) and, for *every* frame, the accepted manifest (both agent
key forms) is absent or names another raw object and no quarantine record of its
identity names the bundle. Requests: one GET of the bundle, one GET per manifest key form
of each frame, one LIST per quarantine prefix form of each agent/boot pair.
"""

from __future__ import annotations

import hashlib
import uuid

import pytest

from protocol import bundle as bd
from protocol import keys, records
from protocol._bundle_index import BundleEntry, pack_tail
from protocol.frame_encode import encode_frame, points_table
from reconciler.gc.problems import GcProblems
from reconciler.gc.proof import TargetedProof, Verdict
from store.counting import CountingStore
from store.errors import NotFound
from store.memory import MemoryStore
from tests.reconciler.conftest import conflict_of

NS = 1_000_000_000
BOOT = uuid.UUID("5f0c7a3e-1d2b-4c3a-9e8f-0123456789ab")
OTHER_BOOT = uuid.UUID(int=7)
LONG_AGENT = "x" * 128  # its key segment is h-<sha256>; the long form is a legacy key


def frame(seq: int, *, agent: str = "agent-a", boot: uuid.UUID = BOOT, value: float = 1.0) -> bytes:
    table = points_table([1_760_000_000 * NS + seq], ["cpu"], [value], [None])
    return encode_frame(agent_id=agent, boot_id=boot, seq_start=seq, points=table)


def manifest_of(
    body: bytes, *, bundle: bd.EncodedBundle | None = None, i: int = 0
) -> records.AcceptedManifest:
    where = (bundle.key, bundle.entries[i].offset) if bundle is not None else None
    return records.AcceptedManifest.of_frame(
        body, accepted_at_unix_ns=1_760_000_000 * NS, collector_id="c-1", bundle=where
    )


class World:
    def __init__(self) -> None:
        self.memory = MemoryStore()
        self.store = CountingStore(self.memory)

        async def fence() -> None:
            return None

        self.proof = TargetedProof(
            self.store,
            GcProblems(self.memory, lambda: 1_760_000_000 * NS, fence),
            max_frame_bytes=1 << 20,
            max_bundle_bytes=8 << 20,
        )

    async def put_bundle(self, frames: list[bytes]) -> bd.EncodedBundle:
        bundle = bd.encode_bundle(frames)
        await self.memory.put(bundle.key, bundle.data)
        return bundle

    async def put_raw(self, data: bytes) -> str:
        key = keys.raw_bundle_key(hashlib.sha256(data).hexdigest())
        await self.memory.put(key, data)
        return key

    async def prove(self, key: str, *, by_retention: bool = False) -> Verdict:
        self.store.clear()
        return (await self.proof.prove(key, by_retention=by_retention)).verdict

    async def problem(self, kind: str, subject: str) -> bool:
        try:
            await self.memory.head(keys.problem_key(kind, subject))
        except NotFound:
            return False
        return True


FRAMES = [frame(1), frame(2, value=2.0), frame(3, value=3.0)]


async def test_a_bundle_whose_every_frame_manifest_is_absent_is_proven() -> None:
    world = World()
    bundle = await world.put_bundle(FRAMES)
    assert await world.prove(bundle.key) is Verdict.PROVEN
    # 1 GET of the bundle, 1 manifest GET per frame (agent-a has one key form), and one
    # quarantine LIST for the one agent/boot pair: never one per frame.
    assert world.store.count("get", "raw-bundles/") == 1
    assert world.store.count("get", keys.ACCEPTED_PREFIX) == 3
    assert world.store.count("list") == 1
    assert world.store.count("head") == 0


async def test_frames_whose_manifests_name_another_raw_object_do_not_keep_it() -> None:
    world = World()
    bundle = await world.put_bundle(FRAMES)
    for body in FRAMES:  # each accepted as its own frame blob (this bundle is dead bytes)
        manifest = manifest_of(body)
        await world.memory.put(manifest.manifest_key, manifest.to_json())
    assert await world.prove(bundle.key) is Verdict.PROVEN


@pytest.mark.parametrize("i", [0, 1, 2])
async def test_one_frame_whose_manifest_names_the_bundle_keeps_it(i: int) -> None:
    world = World()
    bundle = await world.put_bundle(FRAMES)
    manifest = manifest_of(FRAMES[i], bundle=bundle, i=i)
    await world.memory.put(manifest.manifest_key, manifest.to_json())
    assert await world.prove(bundle.key) is Verdict.WITHDRAW


async def test_a_manifest_at_the_legacy_agent_key_form_keeps_the_bundle() -> None:
    world = World()
    frames = [frame(1), frame(5, agent=LONG_AGENT)]
    bundle = await world.put_bundle(frames)
    manifest = manifest_of(frames[1], bundle=bundle, i=1)
    legacy = keys.legacy_accepted_manifest_key(manifest.identity)
    assert legacy is not None and legacy != manifest.manifest_key
    await world.memory.put(legacy, manifest.to_json())
    assert await world.prove(bundle.key) is Verdict.WITHDRAW


async def test_a_quarantine_record_of_one_frame_naming_the_bundle_stops_its_gc() -> None:
    world = World()
    bundle = await world.put_bundle(FRAMES)
    twin = frame(2, value=99.0)  # a conflicting frame of frame 2's identity
    accepted = manifest_of(FRAMES[1], bundle=bundle, i=1)
    # not well-formed: records name frame blobs only
    conflict = conflict_of(
        accepted, manifest_of(twin).frame_sha256, accepted_raw_blob_key=bundle.key
    )
    await world.memory.put(conflict.quarantine_key, conflict.to_json())
    assert await world.prove(bundle.key) is Verdict.UNPROVEN
    assert await world.problem("unparseable-quarantine", conflict.quarantine_key)


async def test_a_well_formed_quarantine_record_of_a_frame_does_not_keep_the_bundle() -> None:
    world = World()
    bundle = await world.put_bundle(FRAMES)
    twin = frame(3, value=42.0)
    accepted = manifest_of(FRAMES[2])
    # its accepted side the frame blob (copy), not the bundle
    conflict = conflict_of(accepted, manifest_of(twin).frame_sha256)
    await world.memory.put(conflict.quarantine_key, conflict.to_json())
    assert await world.prove(bundle.key) is Verdict.PROVEN
    assert world.store.count("get", keys.QUARANTINE_PREFIX) == 1


async def test_one_list_per_quarantine_prefix_form_of_each_agent_boot_pair() -> None:
    world = World()
    frames = [
        frame(1),
        frame(2),
        frame(3, boot=OTHER_BOOT),
        frame(4, boot=OTHER_BOOT),
        frame(5, agent=LONG_AGENT),
        frame(6, agent=LONG_AGENT),
    ]
    bundle = await world.put_bundle(frames)
    assert await world.prove(bundle.key) is Verdict.PROVEN
    # agent-a: 2 boots x 1 form; the long agent: 1 boot x 2 forms (h- and long).
    assert world.store.count("list") == 4
    expected = {
        p for body in frames for p in keys.quarantine_boot_prefixes(manifest_of(body).identity)
    }
    assert set(world.store.keys_of("list")) == expected
    # Manifests: 4 frames of agent-a (1 form) + 2 of the long agent (2 forms each).
    assert world.store.count("get", keys.ACCEPTED_PREFIX) == 8


def _corruptions() -> dict[str, bytes]:
    good = bd.encode_bundle(FRAMES)
    data = good.data
    out: dict[str, bytes] = {}
    out["bad footer"] = data[:-1] + bytes([data[-1] ^ 0xFF])  # magic
    tail_start = len(data) - bd.FOOTER_LEN - bd.ENTRY_LEN * len(FRAMES)
    index_byte = tail_start + 20  # inside entry 0's frame_sha256: the index CRC fails
    out["bad index CRC"] = (
        data[:index_byte] + bytes([data[index_byte] ^ 1]) + data[index_byte + 1 :]
    )
    # Frame 2's payload damaged, the index rebuilt with its new hash: only its CRC fails.
    f1 = bytearray(FRAMES[1])
    f1[60] ^= 0xFF
    frames = [FRAMES[0], bytes(f1), FRAMES[2]]
    entries = [
        BundleEntry(e.offset, e.length, hashlib.sha256(f).hexdigest())
        for e, f in zip(good.entries, frames, strict=True)
    ]
    out["frame CRC"] = b"".join(frames) + pack_tail(entries)
    # An index that tiles the data part but disagrees with the frames' own headers:
    # frames 0 and 1 have different lengths, their entries' lengths swapped.
    e0, e1, e2 = good.entries
    swapped = [
        BundleEntry(0, e1.length, e0.frame_sha256),
        BundleEntry(e1.length, e0.length, e1.frame_sha256),
        e2,
    ]
    out["index disagrees with the tiling"] = b"".join(FRAMES) + pack_tail(swapped)
    return out


def test_each_corruption_fails_the_bundle_checker() -> None:
    assert len(FRAMES[0]) != len(FRAMES[1])  # so swapping their lengths still tiles
    for name, data in _corruptions().items():
        with pytest.raises(bd.BundleError):
            bd.check_bundle(data)
        assert data != bd.encode_bundle(FRAMES).data, name


@pytest.mark.parametrize("name", sorted(_corruptions()))
async def test_a_corrupt_bundle_is_a_corrupt_blob_never_deleted(name: str) -> None:
    world = World()
    key = await world.put_raw(_corruptions()[name])
    assert await world.prove(key) is Verdict.WITHDRAW
    assert await world.prove(key, by_retention=True) is Verdict.WITHDRAW
    assert await world.problem("corrupt-blob", key)
    assert world.store.count("get", keys.ACCEPTED_PREFIX) == 0  # decided before any record


async def test_a_bundle_whose_bytes_do_not_hash_to_its_name_is_corrupt() -> None:
    world = World()
    bundle = bd.encode_bundle(FRAMES)
    other = keys.raw_bundle_key("0" * 64)
    await world.memory.put(other, bundle.data)
    assert await world.prove(other) is Verdict.WITHDRAW
    assert await world.problem("corrupt-blob", other)


async def test_a_bundle_listed_larger_than_the_largest_is_corrupt_without_a_read() -> None:
    world = World()
    bundle = await world.put_bundle(FRAMES)
    world.store.clear()
    proof = await world.proof.prove(bundle.key, by_retention=False, size=(8 << 20) + 1)
    assert proof.verdict is Verdict.WITHDRAW
    assert world.store.count("get") == 0
    assert await world.problem("corrupt-blob", bundle.key)


async def test_a_gone_bundle_is_withdrawn() -> None:
    world = World()
    assert await world.prove(keys.raw_bundle_key("a" * 64)) is Verdict.WITHDRAW


# --- raw retention's variant (PROTOCOL §4.1, §3.10): a bundle goes only whole -------------


async def retention_world(
    frames: list[bytes], *, naming: list[int], included: list[int]
) -> tuple[TargetedProof, bd.EncodedBundle]:
    """A bundle of ``frames``; the manifests of ``naming`` name it (the others name their
    own frame blobs: duplicates, dead bytes here); the rollup ledger includes the batches
    of ``included``; raw retention has retired their accepted hour."""
    from tests.reconciler.test_gc import World as GcWorld
    from tests.reconciler.test_raw_retention import include

    world = GcWorld()
    bundle = bd.encode_bundle(frames)
    await world.store.put(bundle.key, bundle.data)
    manifests = [
        manifest_of(body, bundle=bundle if i in naming else None, i=i)
        for i, body in enumerate(frames)
    ]
    for manifest in manifests:
        await world.store.put(manifest.manifest_key, manifest.to_json())
    await include(world, *(manifests[i] for i in included))
    state = records.RawRetention(
        retired_before=manifests[0].accepted_hour.next().iso,
        updated_at_unix_ns=world.clock.now_ns(),
        raw_days=1.0,
    )
    await world.store.put(keys.RAW_RETENTION_KEY, state.to_json())

    async def fence() -> None:
        return None

    problems = GcProblems(world.store, world.clock.now_ns, fence)
    return TargetedProof(world.store, problems, 1 << 20, max_bundle_bytes=8 << 20), bundle


async def test_raw_retention_deletes_a_bundle_once_every_frame_naming_it_is_rolled_up() -> None:
    proof, bundle = await retention_world(FRAMES, naming=[0, 1, 2], included=[0, 1, 2])
    assert (await proof.prove(bundle.key, by_retention=True)).verdict is Verdict.PROVEN


async def test_raw_retention_keeps_a_bundle_with_one_frame_not_rolled_up() -> None:
    proof, bundle = await retention_world(FRAMES, naming=[0, 1, 2], included=[0, 2])
    verdict = await proof.prove(bundle.key, by_retention=True)
    assert verdict.verdict is Verdict.WITHDRAW and "ledger" in verdict.why
    # ... and as a plain orphan it is referenced: its manifests name it.
    assert (await proof.prove(bundle.key, by_retention=False)).verdict is Verdict.WITHDRAW


async def test_a_frame_whose_manifest_names_another_object_does_not_pin_the_bundle() -> None:
    # Frame 1 was accepted as its own frame blob (the bundle's copy is dead bytes): only
    # the frames whose manifests name the bundle must be rolled up.
    proof, bundle = await retention_world(FRAMES, naming=[0, 2], included=[0, 2])
    assert (await proof.prove(bundle.key, by_retention=True)).verdict is Verdict.PROVEN


# --- the whole GC run on a bundle: mark, grace, audit, proofs, one DELETE of the whole -----


class BundleGcWorld:
    """`tests.reconciler.test_gc.World` (real steady pass, audit and GC on a memory store)
    with a planted orphan bundle, which the audit lists under ``raw-bundles/v1/`` and names
    in its orphan file by its raw key (PROTOCOL §3.5 Candidates); the GC's requests are
    counted."""

    def __init__(self, frames: list[bytes]) -> None:
        from tests.reconciler.test_gc import World as GcWorld

        self.world = GcWorld()
        self.counting = CountingStore(self.world.store)
        self.world.store = self.counting  # the GC, steady pass and audit go through it
        self.bundle = bd.encode_bundle(frames)

    async def plant(self) -> None:
        await self.world.accept(frame(99, agent="agent-z"))  # a listed blob for the guard
        await self.counting.inner.put(self.bundle.key, self.bundle.data)
        self.world.clock.advance(3 * 3600.0)
        first = await self.world.gc(audit=True)
        assert first.record.marked == 1
        mark = records.GcMark.from_json(
            (await self.counting.inner.get(keys.gc_mark_key(self.bundle.sha256)))[0]
        )
        assert mark.raw_blob_key == self.bundle.key  # marks record the object's key
        self.world.clock.advance(601.0)


async def test_the_gc_deletes_an_orphan_bundle_whole_and_logs_it() -> None:
    frames = [frame(1), frame(2, value=2.0), frame(3, boot=OTHER_BOOT)]
    gc = BundleGcWorld(frames)
    await gc.plant()
    gc.world.clock.advance(1.0)
    await gc.world.audit()  # the next scheduled audit (it verifies the bundle: one GET)
    gc.counting.clear()
    outcome = await gc.world.gc()
    # The GC's requests on the candidate bundle (both proofs, after the grace and after
    # "deleting"): 2 GETs of the bundle (read whole), 2 x 3 manifest GETs, 2 x 2 quarantine
    # LISTs (two agent/boot pairs), no HEAD (rule 1 is the audit's listing after the mark);
    # the DELETE is one signed request (`store.base.SignedDelete`).
    bundle_gets = gc.counting.count("get", keys.RAW_BUNDLES_PREFIX)
    bundle_heads = gc.counting.count("head", keys.RAW_BUNDLES_PREFIX)
    manifest_gets = gc.counting.count("get", keys.ACCEPTED_PREFIX)
    quarantine_lists = [p for p, _ in gc.counting.lists if p.startswith(keys.QUARANTINE_PREFIX)]
    assert (bundle_gets, bundle_heads, manifest_gets, len(quarantine_lists)) == (2, 0, 6, 4)
    assert outcome.deleted == [gc.bundle.sha256]
    assert not await gc.world.exists(gc.bundle.key)
    assert not await gc.world.exists(keys.gc_mark_key(gc.bundle.sha256))
    [entry] = await gc.world.gc_log()
    assert entry.raw_blob_key == gc.bundle.key


async def test_a_manifest_created_after_the_audit_naming_the_bundle_keeps_it() -> None:
    gc = BundleGcWorld(FRAMES)
    await gc.plant()
    # A frame's manifest landed late (its answer was lost) and its log row with it: only
    # the manifest itself names the bundle.
    manifest = manifest_of(FRAMES[2], bundle=gc.bundle, i=2)
    await gc.counting.inner.put(manifest.manifest_key, manifest.to_json())
    outcome = await gc.world.gc()
    assert outcome.deleted == [] and await gc.world.exists(gc.bundle.key)
    assert not await gc.world.exists(keys.gc_mark_key(gc.bundle.sha256))  # withdrawn


async def test_a_catalog_row_created_since_the_audit_naming_the_bundle_keeps_it() -> None:
    from index.rows import accepted_row

    gc = BundleGcWorld(FRAMES)
    await gc.plant()
    # Rule 2's second half: a catalog file written after the audit started holds a row
    # naming the bundle by its raw key (its frame's hash names no candidate); the
    # manifest itself is not in the store, so only this read can see it.
    row = accepted_row(manifest_of(FRAMES[0], bundle=gc.bundle, i=0))
    ctx = await gc.world.ctx()
    await ctx.catalog_writer.write(row.hour, [row], writer="steady")
    outcome = await gc.world.gc()
    assert outcome.deleted == [] and await gc.world.exists(gc.bundle.key)
    assert not await gc.world.exists(keys.gc_mark_key(gc.bundle.sha256))  # withdrawn


async def test_an_unreadable_mark_of_a_present_bundle_is_not_logged_as_a_deletion() -> None:
    from tests.reconciler.test_gc import POLICY
    from tests.reconciler.test_gc import World as GcWorld

    world = GcWorld()
    await world.ctx()  # our lease term starts now
    bundle = bd.encode_bundle(FRAMES)
    await world.store.put(bundle.key, bundle.data)
    await world.store.put(keys.gc_mark_key(bundle.sha256), b'{"schema": "lightmetrics.gc')
    await world.gc()
    world.clock.advance(POLICY.settle_s + 1)
    await world.gc()
    assert not await world.exists(keys.gc_mark_key(bundle.sha256))  # settled
    assert await world.exists(bundle.key)
    assert await world.gc_log() == []  # the bundle is there: no deletion is recorded


async def test_raw_retention_deletes_a_bundle_only_once_its_last_frame_is_rolled_up() -> None:
    """End to end (real audit, raw retention and GC): a bundle whose frames were accepted
    in two hours is kept whole while the later hour is not rolled up (its frame pins it:
    the audit does not nominate it), and deleted once that hour is retired too."""
    from protocol.clock import ManualClock
    from store.memory import MemoryStore
    from tests.reconciler.test_gc import World as GcWorld
    from tests.reconciler.test_raw_retention import GUARDED, audit_now, include, retire

    clock = ManualClock()
    world = GcWorld(GUARDED, store=CountingStore(MemoryStore(clock=clock)))
    world.clock = clock
    bundle = bd.encode_bundle(FRAMES)
    await world.store.put(bundle.key, bundle.data)

    def accepted(i: int) -> records.AcceptedManifest:
        return records.AcceptedManifest.of_frame(
            FRAMES[i],
            accepted_at_unix_ns=clock.now_ns(),
            collector_id="c-1",
            bundle=(bundle.key, bundle.entries[i].offset),
        )

    manifests = [accepted(0), accepted(1)]
    clock.advance(3600.0)
    manifests.append(accepted(2))  # the last frame's manifest lands in the next hour
    for manifest in manifests:
        await world.store.put(manifest.manifest_key, manifest.to_json())
    clock.advance(4 * 3600.0)
    await audit_now(world)  # catalogs the manifests and seals both hours
    await include(world, manifests[0], manifests[1])  # the later hour is not rolled up
    state = await retire(world)
    assert state is not None and state.retired_before == manifests[2].accepted_hour.iso
    record = await audit_now(world)
    assert record.bundles_listed == 1
    pinned = record.model_dump().get("bundle_pinned_bytes")
    assert pinned in (None, len(bundle.data))  # recorded by audits that compute it
    await world.gc()
    clock.advance(GUARDED.mark_grace_s + 1)
    assert (await world.gc()).deleted == []
    assert await world.exists(bundle.key)
    assert not await world.exists(keys.gc_mark_key(bundle.sha256))  # never nominated

    await include(world, manifests[2])
    assert (await retire(world)) is not None
    await audit_now(world)
    marked = await world.gc()
    assert marked.record.marked == 1
    mark = records.GcMark.from_json((await world.store.get(keys.gc_mark_key(bundle.sha256)))[0])
    assert (mark.raw_blob_key, mark.reason) == (bundle.key, "raw-retention")
    clock.advance(GUARDED.mark_grace_s + 1)
    await audit_now(world)
    deleted = await world.gc()
    assert deleted.deleted == [bundle.sha256] and deleted.record.deleted_raw_retention == 1
    assert not await world.exists(bundle.key)
    for manifest in manifests:
        assert await world.exists(manifest.manifest_key)  # manifests stay
