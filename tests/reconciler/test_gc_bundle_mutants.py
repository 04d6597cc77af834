"""Mutants of GC rule 7 and raw retention for bundles (issue 33 "Correctness"), each put
back with ``monkeypatch`` for one test, each flagged: with it, the world of a test of
`tests.reconciler.test_gc_bundles` that guards against it ends unsafe (the proof lets the
bundle go), so that test fails.

The seeded simulation flags all four. `BUNDLE_LANDING_WORLD` of
`tests/chaos/test_simulation_bundles.py` (orphan bundles written again, half as soon as an
audit nominated them through a collector that loses its log rows, half with only their last
frame naming them) ends with the GC deleting a referenced bundle when rule 7 skips the last
frame (since commit 72467a3). The others need a fault no simulated collector leaves, planted
by the worlds of `tests/chaos/test_simulation_bundle_mutants.py`: a bundle whose frames
disagree with its index, named by a manifest of an indexed frame (the index mutant,
`BUNDLE_UNLIKE_ITS_INDEX_WORLD`); a quarantine record naming a bundle, landing after the
audit past the mark's grace (the quarantine mutant, `QUARANTINED_BUNDLE_WORLD`); and a
bundle of the retired hour one of whose frames' manifest lands after raw retention
nominated it (the retention mutant, `BUNDLES_RETIRING_APART_WORLD`), which the audit's
nomination (a bundle retired only when every row naming it is) otherwise keeps from the
proof.
"""

from __future__ import annotations

import pytest

import reconciler.gc.proof as proof_module
from protocol import bundle as bd
from protocol import keys, records
from protocol._bundle_index import pack_tail
from protocol.frame import FrameError, decode_header
from reconciler.gc.proof import TargetedProof, Verdict
from tests.reconciler.conftest import conflict_of
from tests.reconciler.test_gc_bundles import (
    FRAMES,
    World,
    frame,
    manifest_of,
    retention_world,
)


async def _proof_of_a_bundle_named_by_its_last_frame() -> Verdict:
    world = World()
    bundle = await world.put_bundle(FRAMES)
    manifest = manifest_of(FRAMES[2], bundle=bundle, i=2)
    await world.memory.put(manifest.manifest_key, manifest.to_json())
    return await world.prove(bundle.key)


async def test_mutant_rule_7_skipping_one_frame_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    assert await _proof_of_a_bundle_named_by_its_last_frame() is Verdict.WITHDRAW
    real = TargetedProof._manifests

    async def skip_last(  # type: ignore[no-untyped-def]
        self, raw_key: str, identities: list[keys.BatchIdentity], *, by_retention: bool
    ):
        return await real(self, raw_key, identities[:-1], by_retention=by_retention)

    monkeypatch.setattr(TargetedProof, "_manifests", skip_last)
    assert await _proof_of_a_bundle_named_by_its_last_frame() is Verdict.PROVEN


def _a_frame_swapped_under_its_index_entry() -> bytes:
    """A bundle whose frame 1 is another valid frame of the same length: the index (which
    tiles, CRC intact) still names the old frame's hash."""
    other = frame(2, agent="agent-b", value=2.0)  # another batch, as long
    assert len(other) == len(FRAMES[1]) and other != FRAMES[1]
    good = bd.encode_bundle(FRAMES)
    return b"".join([FRAMES[0], other, FRAMES[2]]) + pack_tail(list(good.entries))


def check_bundle_trusting_the_index(data: bytes, *, sha256: str | None = None) -> bd.CheckedBundle:
    """The mutant of `protocol.bundle.check_bundle` as the proof calls it: the frames found
    through the index, each header checked where its entry points; what the bytes there
    hash to is not compared with the entry, nor do the frames have to tile."""
    try:
        frames = tuple(
            bd.BundledFrame(entry, decode_header(data[entry.offset : entry.end]))
            for entry in bd.read_index(data)
        )
    except FrameError as exc:
        raise bd.BundleError(str(exc)) from None
    return bd.CheckedBundle(sha256 or "", len(data), frames)


async def test_mutant_rule_7_trusting_the_index_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _a_frame_swapped_under_its_index_entry()
    world = World()
    key = await world.put_raw(data)
    assert await world.prove(key) is Verdict.WITHDRAW  # corrupt-blob: never deleted
    assert await world.problem("corrupt-blob", key)
    monkeypatch.setattr(proof_module, "check_bundle", check_bundle_trusting_the_index)
    world = World()
    key = await world.put_raw(data)
    assert await world.prove(key) is Verdict.PROVEN


async def test_mutant_quarantine_list_skipped_for_one_frame_is_flagged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def proof_with_a_record_naming_the_bundle() -> Verdict:
        world = World()
        bundle = await world.put_bundle(FRAMES)
        accepted = manifest_of(FRAMES[2])
        conflict = conflict_of(accepted, "c" * 64, accepted_raw_blob_key=bundle.key)
        await world.memory.put(conflict.quarantine_key, conflict.to_json())
        return await world.prove(bundle.key)

    assert await proof_with_a_record_naming_the_bundle() is Verdict.UNPROVEN
    real = TargetedProof._quarantines

    async def skipping_the_last_frame(  # type: ignore[no-untyped-def]
        self, raw_key: str, sha: str, prefixes: list[str], wanted: set[str], *, bundle: bool
    ):
        last = keys.quarantine_identity_prefixes(manifest_of(FRAMES[2]).identity)
        return await real(self, raw_key, sha, prefixes, wanted - set(last), bundle=bundle)

    monkeypatch.setattr(TargetedProof, "_quarantines", skipping_the_last_frame)
    assert await proof_with_a_record_naming_the_bundle() is Verdict.PROVEN


async def test_mutant_raw_retention_with_one_frame_not_rolled_up_is_flagged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proof, bundle = await retention_world(FRAMES, naming=[0, 1, 2], included=[0, 1])
    assert (await proof.prove(bundle.key, by_retention=True)).verdict is Verdict.WITHDRAW
    real = TargetedProof._rolled_up
    seen: list[str] = []

    async def first_frame_only(self, manifest: records.AcceptedManifest) -> bool:  # type: ignore[no-untyped-def]
        seen.append(manifest.frame_sha256)
        return await real(self, manifest) if len(seen) == 1 else True

    monkeypatch.setattr(TargetedProof, "_rolled_up", first_frame_only)
    proof, bundle = await retention_world(FRAMES, naming=[0, 1, 2], included=[0, 1])
    assert (await proof.prove(bundle.key, by_retention=True)).verdict is Verdict.PROVEN
