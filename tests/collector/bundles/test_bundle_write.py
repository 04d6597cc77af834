"""Every outcome of a bundle's one conditional PutObject, for every frame in it (PROTOCOL
§3.10 "Writing"), and what happens when a frame's manifest is another's."""

from __future__ import annotations

from chaos.faulty_store import Fault
from collector.accept import AcceptanceUnavailable, Accepted, IdentityConflictFound
from protocol import keys, records
from protocol.bundle import encode_bundle
from protocol.frame import decode_header
from store.base import ObjectInfo
from store.errors import NotFound
from tests.collector.bundles.harness import BundleHarness, frame_sha, frames


def bundle_of(rest: list[bytes]) -> tuple[str, str, bytes]:
    """(key, sha, bytes) of the bundle these frames make, in this order."""
    encoded = encode_bundle(rest)
    return encoded.key, encoded.sha256, encoded.data


async def bundles_in(harness: BundleHarness) -> list[str]:
    return [info.key async for info in harness.memory.list(keys.RAW_BUNDLES_PREFIX)]


def blob_rows(harness: BundleHarness) -> list[str]:
    return [row.key for row in harness.index_log._buffer if row.kind == "blob"]


async def test_a_created_bundle_is_logged_then_each_manifest_created() -> None:
    harness = BundleHarness()
    first, *rest = frames(3)
    answers = await harness.held_then_bundled(first, rest)
    key, sha, _data = bundle_of(rest)
    assert all(isinstance(a, Accepted) and not a.duplicate for a in answers)
    assert await bundles_in(harness) == [key]
    assert blob_rows(harness).count(key) == 1
    row = next(r for r in harness.index_log._buffer if r.key == key)
    assert row.frame_sha256 == sha  # the raw object's hash, as a frame blob's row


async def test_an_identical_bundle_already_there_takes_the_collector_side_on_the_bundle() -> None:
    harness = BundleHarness()
    first, *rest = frames(3)
    key, sha, data = bundle_of(rest)
    await harness.memory.put(key, data)
    mark = records.GcMark(frame_sha256=sha, raw_blob_key=key, marked_at_unix_ns=1, gc_run_id="gc")
    await harness.memory.put(keys.gc_mark_key(sha), mark.to_json())
    answers = await harness.held_then_bundled(first, rest)
    assert all(isinstance(a, Accepted) for a in answers)
    names = harness.op_names()
    # mark read, veto, mark read again, HEAD of the bundle: all before any of its manifests
    bundle_ops = names[names.index("put_raw_bundle") :]
    assert bundle_ops[:5] == [
        "put_raw_bundle",
        "get_gc_mark",
        "put_gc_veto",
        "get_gc_mark",
        "head_raw_blob",
    ]
    assert ("head_raw_blob", "ok") in harness.ops
    veto = records.GcVeto.from_json((await harness.memory.get(keys.gc_veto_key(sha)))[0])
    assert veto.frame_sha256 == sha  # the bundle's hash, never a frame's
    assert veto.raw_blob_key == key
    for frame in rest:
        assert not await exists(harness, keys.gc_veto_key(frame_sha(frame)))
        assert (await harness.manifest(frame)).raw_blob_key == key


async def test_an_identical_bundle_deleted_under_the_412_is_created_again() -> None:
    harness = BundleHarness()
    first, *rest = frames(3)
    key, _sha, data = bundle_of(rest)
    await harness.memory.put(key, data)
    inner = harness.memory.inner
    original_head = inner.head

    async def vanished_head(k: str) -> ObjectInfo:
        if k == key:
            await inner.delete(key)
        return await original_head(k)

    inner.head = vanished_head  # type: ignore[method-assign, assignment]
    answers = await harness.held_then_bundled(first, rest)
    assert all(isinstance(a, Accepted) for a in answers)
    assert (await harness.memory.get(key))[0] == data
    assert harness.op_names().count("put_raw_bundle") == 2
    assert key in blob_rows(harness)  # created again: logged as a new raw object


async def test_conflict_unavailable_and_unknown_answers_send_the_same_bytes_again() -> None:
    harness = BundleHarness()
    first, *rest = frames(3)
    harness.store.script(
        "put_if_none_match",
        keys.RAW_BUNDLES_PREFIX,
        Fault.CONFLICT,
        Fault.UNAVAILABLE,
        Fault.UNKNOWN_NOT_APPLIED,
    )
    answers = await harness.held_then_bundled(first, rest)
    key, _sha, data = bundle_of(rest)
    assert all(isinstance(a, Accepted) and not a.duplicate for a in answers)
    assert harness.op_names().count("put_raw_bundle") == 4
    assert (await harness.memory.get(key))[0] == data
    assert blob_rows(harness).count(key) == 1


async def test_a_lost_answer_then_412_is_proven_by_a_head_and_accepted() -> None:
    harness = BundleHarness()
    first, *rest = frames(3)
    harness.store.script("put_if_none_match", keys.RAW_BUNDLES_PREFIX, Fault.LOST_REPLY)
    answers = await harness.held_then_bundled(first, rest)
    key, _sha, _data = bundle_of(rest)
    assert all(isinstance(a, Accepted) and not a.duplicate for a in answers)
    names = harness.op_names()
    assert names.count("put_raw_bundle") == 2 and "head_raw_blob" in names
    assert key in blob_rows(harness)


async def test_a_bundle_write_given_up_answers_every_frame_503_and_creates_no_manifest() -> None:
    harness = BundleHarness()
    first, *rest = frames(3)
    harness.store.script("put_if_none_match", keys.RAW_BUNDLES_PREFIX, *[Fault.UNAVAILABLE] * 20)
    answers = await harness.held_then_bundled(first, rest)
    assert isinstance(answers[0], Accepted)
    assert all(isinstance(a, AcceptanceUnavailable) for a in answers[1:])
    assert "put_manifest" not in harness.op_names()[harness.op_names().index("put_raw_bundle") :]
    for frame in rest:
        assert not await exists(harness, (await manifest_key(frame)))
    assert not [k for k in blob_rows(harness) if k.startswith(keys.RAW_BUNDLES_PREFIX)]


async def test_a_bundle_whose_outcome_stayed_unknown_is_logged_and_every_frame_503() -> None:
    harness = BundleHarness()
    first, *rest = frames(3)
    harness.store.script(
        "put_if_none_match", keys.RAW_BUNDLES_PREFIX, *[Fault.LOST_REPLY] + [Fault.CONFLICT] * 20
    )
    answers = await harness.held_then_bundled(first, rest)
    key, _sha, _data = bundle_of(rest)
    assert all(isinstance(a, AcceptanceUnavailable) for a in answers[1:])
    assert key in blob_rows(harness)  # it may exist: the GC finds it by time
    for frame in rest:
        assert not await exists(harness, await manifest_key(frame))


async def test_a_duplicate_in_a_bundle_leaves_dead_bytes_and_answers_the_stored_manifest() -> None:
    harness = BundleHarness(enabled=False)
    first, dup, new = frames(3)
    assert isinstance(await harness.accept(dup), Accepted)  # accepted earlier, as a frame blob
    harness.enabled = True
    answers = await harness.held_then_bundled(first, [dup, new])
    assert isinstance(answers[1], Accepted) and answers[1].duplicate
    assert answers[1].manifest.raw_blob_key == keys.raw_blob_key(frame_sha(dup))
    assert isinstance(answers[2], Accepted) and not answers[2].duplicate
    assert harness.dead_bytes == len(dup)


async def test_a_conflict_in_a_bundle_writes_the_submitted_frame_blob_for_the_record() -> None:
    harness = BundleHarness(enabled=False)
    first, other, new = frames(3)
    assert isinstance(await harness.accept(other), Accepted)
    harness.enabled = True
    conflicting = frames(2, value=9.0)[1]  # the identity of `other`, other bytes
    answers = await harness.held_then_bundled(first, [conflicting, new])
    conflict = answers[1]
    assert isinstance(conflict, IdentityConflictFound)
    record = records.IdentityConflict.from_json(
        (await harness.memory.get(conflict.quarantine_key))[0]
    )
    sha = frame_sha(conflicting)
    assert record.submitted_raw_blob_key == keys.raw_blob_key(sha)
    assert record.accepted_raw_blob_key == keys.raw_blob_key(frame_sha(other))
    assert (await harness.memory.get(keys.raw_blob_key(sha)))[0] == conflicting
    assert harness.dead_bytes == len(conflicting)


async def exists(harness: BundleHarness, key: str) -> bool:
    try:
        await harness.memory.head(key)
    except NotFound:
        return False
    return True


async def manifest_key(frame: bytes) -> str:
    h = decode_header(frame)
    identity = keys.BatchIdentity(h.agent_id, h.boot_id, h.seq_start, h.seq_end)
    return keys.accepted_manifest_key(identity)


async def test_the_same_frame_twice_in_one_bundle_is_one_accepted_and_one_dead() -> None:
    harness = BundleHarness()
    first, frame = frames(2)
    answers = await harness.held_then_bundled(first, [frame, frame])
    assert sorted(isinstance(a, Accepted) and a.duplicate for a in answers[1:]) == [False, True]
    assert harness.dead_bytes == len(frame)
