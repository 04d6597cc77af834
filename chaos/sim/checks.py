"""What the simulation checks: live, as each store operation is applied (`WatchedStore`),
and at the end over the settled store, after a completed full audit (`check_store`).

Records are joined to raw objects by the raw key they name (PROTOCOL §3.10): a frame
blob, or a bundle with the frame's range. "Its blob is present" means the named raw
object exists, and a bundled frame's bytes are read by `index.raw_reads.read_frame`.

`WatchedStore` also counts what the tests check the worlds exercise: GC marks, vetoes,
blob and bundle deletions and re-creations, index files written, catalog files deleted."""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

from chaos.index_checks import RecordFacts, catalog_problems, read_catalog
from chaos.sim.retention import RetentionRule
from config import IngestSettings
from index.raw_reads import BadRange, RawRef, read_frame
from protocol import keys, records
from protocol.bundle import check_bundle
from store.base import ObjectInfo, ObjectStore, SignedDelete
from store.errors import NotFound
from store.memory import MemoryStore


class WatchedStore:
    """`MemoryStore` that checks, as each operation is applied, that the GC never deletes
    a referenced raw object (with raw retention: one that `RetentionRule` does not let
    go), no manifest or quarantine record is created while its (submitted) raw object is
    missing, and no quarantine record says its accepted blob is present while it is
    missing.

    With ``mark_grace_s`` (every simulated world) also PROTOCOL §3.5 rule 3's premise:
    no record lands naming a raw object whose GC mark has been ``marked`` for longer than
    the grace with no veto (the GC may have proved it an orphan already; a collector's
    create lands within the settle margin of its mark read or proof HEAD, or of the
    object's own create, which no mark younger than the retry horizon can precede)."""

    def __init__(
        self,
        inner: MemoryStore,
        *,
        violations: list[str],
        stats: Counter[str],
        now_s: Callable[[], float],
        mark_grace_s: float | None = None,
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self._violations = violations
        self._stats = stats
        self._now_s = now_s
        self._mark_grace_s = mark_grace_s
        # raw key -> the accepted manifests naming it, by manifest key
        self._accepted: dict[str, dict[str, records.AcceptedManifest]] = {}
        self._quarantined: dict[str, str] = {}  # raw key (submitted or accepted) -> a record
        self._deleted: set[str] = set()  # raw keys
        self._marked_at: dict[str, float] = {}  # hash -> when its ``marked`` mark was applied
        self._vetoed: set[str] = set()  # hashes with a veto
        self.bundled: dict[str, list[tuple[keys.BatchIdentity, str]]] = {}
        """Every bundle written: its frames' identities and hashes, in order."""
        self.retention: RetentionRule | None = None
        """With raw retention: when a blob accepted manifests name may still be deleted."""
        self.on_put: Callable[[str, bytes], None] = lambda _key, _body: None
        """Told of every PUT applied (the world watches audits complete)."""
        self.on_delete: Callable[[str], None] = lambda _key: None
        """Told of every DELETE applied (signed or not)."""
        self.past_the_grace: set[str] = set()
        """Records planted as a fault that lands past its raw object's grace
        (`chaos.sim.simulation.PlantedFaults`): counted, not a violation of rule 3's premise."""

    async def get(self, key: str) -> tuple[bytes, str]:
        return await self.inner.get(key)

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        return await self.inner.get_range(key, offset, length)

    async def head(self, key: str) -> ObjectInfo:
        return await self.inner.head(key)

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        etag = await self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match)
        await self._applied(key, body, if_none_match)
        return etag

    async def put_file(
        self, key: str, path: str, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        """Forwarded as a file; checked as `put` checks (the body read back from the file:
        the simulation's files are small)."""
        etag = await self.inner.put_file(key, path, if_none_match=if_none_match, if_match=if_match)
        await self._applied(key, await asyncio.to_thread(Path(path).read_bytes), if_none_match)
        return etag

    async def _applied(self, key: str, body: bytes, if_none_match: bool) -> None:
        """Watch a put that the store applied."""
        self._count_put(key, if_none_match)
        self.on_put(key, body)
        self._watch_gc(key, body)
        if key == keys.RAW_RETENTION_KEY and self.retention is not None:
            if (why := self.retention.why_not_retire(body)) is not None:
                self._violation(why)
        if key.startswith(keys.RAW_BUNDLES_PREFIX) and key not in self.bundled:
            checked = check_bundle(body)
            self.bundled[key] = [(f.identity, f.entry.frame_sha256) for f in checked.frames]
        if key in self._deleted:
            bundle = key.startswith(keys.RAW_BUNDLES_PREFIX)
            self._stats["bundles_recreated" if bundle else "blobs_recreated"] += 1
        raw_key = None
        if key.startswith(keys.ACCEPTED_PREFIX):
            manifest = records.AcceptedManifest.from_json(body, reads_bundles=True)
            raw_key = manifest.raw_blob_key
            self._accepted.setdefault(raw_key, {})[key] = manifest
        elif key.startswith(keys.QUARANTINE_PREFIX):
            conflict = records.IdentityConflict.from_json(body)
            raw_key = conflict.submitted_raw_blob_key
            self._quarantined.setdefault(raw_key, key)
            self._quarantined.setdefault(conflict.accepted_raw_blob_key, key)
            await self._check_accepted_blob(key, conflict)
            self._check_grace(key, conflict.accepted_raw_blob_key)
        if raw_key is not None:
            self._check_grace(key, raw_key)
            try:
                await self.inner.head(raw_key)
            except NotFound:
                self._violation(f"{key} was created while its {_raw_name(raw_key)} was missing")

    def _watch_gc(self, key: str, body: bytes) -> None:
        """Marks and vetoes as they land (for `_check_grace`)."""
        if self._mark_grace_s is None:
            return
        if key.startswith(keys.GC_MARKS_PREFIX):
            mark = records.GcMark.from_json(body)
            if mark.state != "marked":
                self._marked_at.pop(mark.frame_sha256, None)
            elif mark.frame_sha256 not in self._marked_at:
                self._marked_at[mark.frame_sha256] = self._now_s()
        elif key.startswith(keys.GC_VETOES_PREFIX):
            self._vetoed.add(records.GcVeto.from_json(body).frame_sha256)

    def _unwatch_gc(self, key: str) -> None:
        if self._mark_grace_s is None:
            return
        for prefix, held in (
            (keys.GC_MARKS_PREFIX, self._marked_at),
            (keys.GC_VETOES_PREFIX, None),
        ):
            if key.startswith(prefix):
                sha = key.removeprefix(prefix).removesuffix(".json")
                if held is not None:
                    held.pop(sha, None)
                else:
                    self._vetoed.discard(sha)

    def _check_grace(self, key: str, raw_key: str) -> None:
        """Rule 3's premise (see the class docstring), with ``mark_grace_s``."""
        if self._mark_grace_s is None:
            return
        sha = keys.parse_raw_object_key(raw_key)[1]
        marked_at = self._marked_at.get(sha)
        if marked_at is None or sha in self._vetoed:
            return
        if (age := self._now_s() - marked_at) > self._mark_grace_s and key in self.past_the_grace:
            self._stats["planted_past_the_grace"] += 1
        elif age > self._mark_grace_s:
            self._violation(
                f"{key} landed naming {_raw_name(raw_key)}, marked {age:.3f}s ago (more than "
                f"the grace, {self._mark_grace_s}s) and not vetoed"
            )

    def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        return self.inner.list(prefix, start_after)

    def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        return self.inner.common_prefixes(prefix)

    async def delete(self, key: str) -> None:
        await self._check_delete(key)
        await self.inner.delete(key)
        self._unwatch_gc(key)
        self.on_delete(key)

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        return await self.inner.sign_delete(key, expires_in_s=expires_in_s)

    async def send_signed_delete(self, request: SignedDelete) -> None:
        await self.inner.send_signed_delete(request)  # raises when refused: nothing deleted
        await self._check_delete(request.key)
        self._unwatch_gc(request.key)
        self.on_delete(request.key)

    async def _check_delete(self, key: str) -> None:
        """Only orphans are deleted (PROTOCOL §3.5); with raw retention also blobs that
        only accepted manifests of rolled-up, expired batches name (§4.1), never one a
        quarantine record names. Records are those that exist as the delete applies."""
        if key.startswith((keys.RAW_BLOBS_PREFIX, keys.RAW_BUNDLES_PREFIX)):
            kind = "bundles" if key.startswith(keys.RAW_BUNDLES_PREFIX) else "blobs"
            if key in self._quarantined:
                self._violation(
                    f"GC deleted {_raw_name(key)} referenced by {self._quarantined[key]}"
                )
            elif accepted := self._accepted.get(key):
                why = (
                    await self.retention.why_not(key, accepted.values())
                    if self.retention is not None
                    else f"referenced by {next(iter(accepted))}"
                )
                if why is not None:
                    self._violation(f"GC deleted {_raw_name(key)}: {why}")
                self._stats[f"{kind}_deleted_accepted"] += 1
            self._stats[f"{kind}_deleted"] += 1
            self._deleted.add(key)
        elif key.startswith(keys.INDEX_CATALOG_PREFIX):
            self._stats["catalog_files_deleted"] += 1

    async def _check_accepted_blob(self, key: str, conflict: records.IdentityConflict) -> None:
        """PROTOCOL §3.2: the collector held off the accepted blob's deletion and HEADed it
        before the record; one that says the blob is there must find it there as it lands
        (a deletion after that HEAD needs a new mark and a grace longer than the request)."""
        if not conflict.accepted_blob_present:
            self._stats["quarantines_accepted_blob_gone"] += 1
            return
        try:
            await self.inner.head(conflict.accepted_raw_blob_key)
        except NotFound:
            self._violation(
                f"{key} says its accepted blob {conflict.accepted_frame_sha256[:12]} is "
                "present, but it is missing"
            )

    def _count_put(self, key: str, if_none_match: bool) -> None:
        for prefix, name in (
            (keys.GC_VETOES_PREFIX, "vetoes_written"),
            (keys.INDEX_LOG_PREFIX, "log_segments_written"),
            (keys.INDEX_CATALOG_PREFIX, "catalog_files_written"),
            (keys.ROLLUP_WORK_PREFIX, "work_markers_written"),
        ):
            if key.startswith(prefix):
                self._stats[name] += 1
        if if_none_match and key.startswith(keys.GC_MARKS_PREFIX):
            self._stats["gc_marked"] += 1
        if key.startswith(keys.RAW_BUNDLES_PREFIX):
            self._stats["bundles_written"] += 1

    async def close(self) -> None:
        await self.inner.close()

    def _violation(self, text: str) -> None:
        self._violations.append(f"t={self._now_s():.3f}s: {text}")


async def check_store(
    store: ObjectStore,
    acked: dict[keys.BatchIdentity, set[str]],
    conflict_views: list[tuple[keys.BatchIdentity, str]],
    *,
    retired: set[str] | frozenset[str] = frozenset(),
    rolled_up: set[str] | frozenset[str] = frozenset(),
    planted: set[str] | frozenset[str] = frozenset(),
) -> list[str]:
    """The end-state invariants over a settled store (after a completed audit).

    ``retired``: manifest_ids whose blobs raw retention may have deleted (in the rollup
    ledger, in a retired hour); every other accepted manifest's blob must exist.
    ``rolled_up``: manifest_ids the committed ledger includes (a rollup that consumes
    work markers: their markers may be gone). ``planted``: keys of records planted as
    faults (`chaos.sim.simulation.PlantedFaults`), whose raw objects are not checked."""
    problems: list[str] = []
    present = {info.key async for info in store.list("")}
    manifests: dict[keys.BatchIdentity, records.AcceptedManifest] = {}
    facts: dict[str, RecordFacts] = {}
    for key in sorted(k for k in present if k.startswith(keys.ACCEPTED_PREFIX)):
        manifest = records.AcceptedManifest.from_json((await store.get(key))[0], reads_bundles=True)
        manifests[manifest.identity] = manifest
        facts[key] = RecordFacts("accepted", manifest.frame_sha256, manifest.identity.manifest_id)
        if key in planted or (
            manifest.identity.manifest_id in retired and manifest.raw_blob_key not in present
        ):
            continue
        ref = RawRef(
            manifest.raw_blob_key,
            manifest.frame_sha256,
            manifest.identity,
            manifest.raw_offset,
            manifest.raw_length,
        )
        problems += await _blob_problems(store, present, key, ref)
    for key in sorted(k for k in present if k.startswith(keys.QUARANTINE_PREFIX)):
        conflict = records.IdentityConflict.from_json((await store.get(key))[0])
        if key in planted:  # not well-formed: the audit reports it, catalogs it not
            continue
        facts[key] = RecordFacts("quarantine", conflict.submitted_frame_sha256)
        for raw_key in (conflict.submitted_raw_blob_key, conflict.accepted_raw_blob_key):
            if not raw_key.startswith(keys.RAW_BLOBS_PREFIX):  # PROTOCOL §3.10
                problems.append(f"{key} names {raw_key}: a quarantine record names frame blobs")
        ref = RawRef(conflict.submitted_raw_blob_key, conflict.submitted_frame_sha256)
        problems += await _blob_problems(store, present, key, ref)
    # Unless a rollup consumed them (``rolled_up``), every cataloged batch must have its
    # marker.
    problems += catalog_problems(await read_catalog(store), facts, rolled_up=rolled_up)
    for identity, shas in acked.items():
        if len(shas) > 1:
            problems.append(f"{identity} was acknowledged with {len(shas)} different hashes")
        held = manifests.get(identity)
        if held is None:
            problems.append(f"{identity} was acknowledged but has no accepted manifest")
        elif held.frame_sha256 not in shas:
            problems.append(
                f"{identity} acknowledged {sorted(shas)} but the manifest says {held.frame_sha256}"
            )
    for identity, accepted_sha in conflict_views:
        held = manifests.get(identity)
        if held is None or held.frame_sha256 != accepted_sha:
            problems.append(f"409 for {identity} named {accepted_sha[:12]}, the store disagrees")
    return problems


async def _blob_problems(store: ObjectStore, present: set[str], key: str, ref: RawRef) -> list[str]:
    """The raw object record ``key`` names is there, and holds its frame: a frame blob
    hashing to its name, or a bundle whose range (else index entry) is the frame,
    read as every reader reads it (`index.raw_reads.read_frame`)."""
    sha = ref.frame_sha256
    if ref.raw_key not in present:
        return [f"{_raw_name(ref.raw_key)} referenced by {key} is missing"]
    frame = await read_frame(store, ref, max_frame_bytes=IngestSettings().max_frame_bytes)
    if isinstance(frame, BadRange):
        return [
            f"{_raw_name(ref.raw_key)} referenced by {key} does not hold its frame {sha[:12]}: {frame.detail}"
        ]
    if hashlib.sha256(frame).hexdigest() != sha:
        return [f"{_raw_name(ref.raw_key)} referenced by {key} does not hash to its name"]
    return []


async def bundle_states(
    store: ObjectStore,
    bundled: Mapping[str, list[tuple[keys.BatchIdentity, str]]],
    answered_503: set[str],
) -> Counter[str]:
    """How the frames of every bundle written ended, over a settled store: ``accepted``
    (its manifest names the bundle), ``duplicate`` (its manifest has its hash but names
    another raw object: dead bytes), ``conflict`` (its manifest has another hash),
    ``unaccepted`` (no manifest); and ``unknown``: frames a send of which was answered
    503 (the outcome unknown to the agent). ``bundles_mixed_<n>``: bundles whose frames
    ended in n of the first four states (``bundles_all_states``: a bundle with accepted,
    duplicate, conflict and unknown frames); ``identities_in_two_bundles``: identities
    whose frames were written in more than one bundle (two collectors raced them)."""
    states: Counter[str] = Counter()
    bundles_of: dict[keys.BatchIdentity, set[str]] = {}
    for bundle_key, frames in bundled.items():
        seen = set()
        for identity, sha in frames:
            bundles_of.setdefault(identity, set()).add(bundle_key)
            manifest = await _manifest(store, identity)
            if manifest is None:
                state = "unaccepted"
            elif manifest.frame_sha256 != sha:
                state = "conflict"
            else:
                state = "accepted" if manifest.raw_blob_key == bundle_key else "duplicate"
            states[f"bundled_{state}"] += 1
            seen.add(state)
            if sha in answered_503:
                states["bundled_unknown"] += 1
                seen.add("unknown")
        states[f"bundles_mixed_{len(seen - {'unknown'})}"] += 1
        if {"accepted", "duplicate", "conflict", "unknown"} <= seen:
            states["bundles_all_states"] += 1
    states["identities_in_two_bundles"] = sum(len(b) > 1 for b in bundles_of.values())
    return states


async def _manifest(
    store: ObjectStore, identity: keys.BatchIdentity
) -> records.AcceptedManifest | None:
    try:
        body, _etag = await store.get(keys.accepted_manifest_key(identity))
    except NotFound:
        return None
    return records.AcceptedManifest.from_json(body, reads_bundles=True)


def _raw_name(raw_key: str) -> str:
    """``raw blob <sha[:12]>`` or ``raw bundle <sha[:12]>``, for violations."""
    kind, sha = keys.parse_raw_object_key(raw_key)
    return f"raw {kind} {sha[:12]}"
