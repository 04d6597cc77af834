"""Rule 7 of PROTOCOL §3.5, the targeted proof: no well-formed record references raw
object B, a frame blob or a bundle (§3.10).

A raw object is content-addressed and each frame's header carries its identity I, so the
only records that can reference B are its frames' accepted manifests and quarantine
records. `TargetedProof` checks exactly those, a few requests per candidate and never a
listing of history:

1. B is read whole (a candidate is an orphan: few, each at most the largest raw object).
   A frame blob's SHA-256 must equal its name and its header (CRC included) must decode
   (`protocol.frame.decode_header`). A bundle must pass `protocol.bundle.check_bundle`:
   its SHA-256, footer and index CRC, and its frames parsed end to end from offset 0 by
   their own headers (never found through the index), tiling the data part exactly,
   equal to the index's entries in order, each passing its CRC and ``frame_sha256``. An
   object that fails is never deleted: a ``corrupt-blob`` problem, and the mark is
   withdrawn.
2. The accepted manifest of each frame's I (every frame of a bundle), at each agent key
   form (`keys.accepted_manifest_key` and `keys.legacy_accepted_manifest_key`), parsed as
   a reader of bundles: "absent" is a 404 only. A manifest whose ``raw_blob_key`` is B
   means B is referenced (the mark is withdrawn); one naming another raw object does not
   (a bundled frame's manifest names its bundle, not the frame blob of its hash; records
   without a range name the frame blob of their ``frame_sha256``, as before bundles). One
   that does not parse fails the proof (``unparseable-manifest``; any other error
   propagates and the candidate is skipped).
3. Quarantine records: for a frame blob, one LIST of I's prefix per agent form
   (`keys.quarantine_identity_prefixes`); for a bundle, one LIST per agent form of each
   agent/boot pair of its frames (`keys.quarantine_boot_prefixes`), which serves all its
   frames of that boot. Normally empty. Each record of a frame's identity is read: one
   naming a frame blob as its submitted or accepted blob references it; one naming a
   bundle is not well-formed (§3.10) and fails the proof with an
   ``unparseable-quarantine`` problem (which blocks every deletion, as rule 5 does for any
   record not well-formed). One that does not parse fails the proof.

Requests per candidate: a frame blob 1 GET + 1-2 manifest GETs + 1-2 LISTs; a bundle of n
frames over b agent/boot pairs 1 GET (the bundle, whole) + n to 2n manifest GETs + b to
2b LISTs (+ a GET per quarantine record of one of its identities). Twice per deletion
(after the grace and after ``deleting``).

**Raw retention's variant**, only for objects raw retention nominates (the audit's orphan
file flags them): step 2 reads instead "some manifest of its frames names B, and for
every one that does, the latest committed rollup ledger includes (I, ``frame_sha256``)":
a ledger row of the manifest's accepted hour with I's ``manifest_id`` and the frame's
hash; frames whose manifests name another object (duplicates: dead bytes) do not keep a
bundle. A bundle is so deleted only whole, once every frame naming it is rolled up. The
nomination must also still stand: the manifest's hour is before
``gc/v1/raw-retention.json``'s ``retired_before`` (an operator who deleted that state to
keep the blobs stops the deletions at once, not at the next audit). Ledger rows do not say
which batches of an hour were *late, excluded* (counted per hour only,
`rollup.table.manifest.Snapshot.ledger_late`), so a batch of an hour with any
late-excluded batch cannot be shown included: its raw object is kept (the conservative
reading; PROTOCOL could give ledger rows a status). Step 3 is unchanged.

Each `TargetedProof` is one GC run's: it reads the rollup snapshot once and each ledger
hour once.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
from dataclasses import dataclass, field

from protocol import keys, records
from protocol.bundle import BundleError, check_bundle
from protocol.frame import FrameError, decode_header
from reconciler.gc.bounded import for_each_bounded
from reconciler.gc.problems import GcProblems
from rollup.table.commit import LoadedSnapshot, load_latest
from rollup.table.ledger import read_ledger
from rollup.table.manifest import RollupManifestError
from store.base import ObjectStore
from store.errors import NotFound

_HASH_IN_THREAD_BYTES = 1 << 20


class Verdict(enum.Enum):
    PROVEN = "proven"
    """Rule 7 holds: no well-formed record references the blob."""
    WITHDRAW = "withdraw"
    """Referenced, gone, corrupt, or (raw retention) not shown rolled up: never delete it
    on this mark; the mark is withdrawn."""
    UNPROVEN = "unproven"
    """A record could not be read (a problem is recorded): keep the mark, prove later."""


@dataclass(frozen=True, slots=True)
class Proof:
    verdict: Verdict
    why: str = ""


PROVEN = Proof(Verdict.PROVEN)


@dataclass
class TargetedProof:
    store: ObjectStore
    problems: GcProblems
    max_frame_bytes: int
    max_bundle_bytes: int = 0
    """The largest valid bundle (``protocol.bundle.max_bundle_bytes`` of the ingest
    settings); 0: ``max_frame_bytes`` (no bundle is valid)."""
    concurrency: int = 8
    """A bundle's manifest GETs and quarantine LISTs in flight at once."""
    _snapshot: LoadedSnapshot | bool | None = False  # False: not read yet
    _retired_before: str | bool | None = False
    _ledger_hours: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    _reading: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def prove(self, raw_key: str, *, by_retention: bool, size: int | None = None) -> Proof:
        """The targeted proof for the raw object ``raw_key``, a frame blob or a bundle (see
        the module docstring). ``size``, when known (a listing, a HEAD), bounds the read
        before it is made: an object larger than any valid one is a ``corrupt-blob``
        problem without a GET. Store errors other than a 404 propagate: nothing is
        decided."""
        kind, sha = keys.parse_raw_object_key(raw_key)
        limit = self._limit(kind)
        if size is not None and size > limit:
            await self._corrupt(raw_key, f"listed at {size} bytes, more than {limit}")
            return Proof(Verdict.WITHDRAW, "corrupt")
        try:
            body, _etag = await self.store.get(raw_key)
        except NotFound:
            return Proof(Verdict.WITHDRAW, "gone")
        bundle = kind == "bundle"
        if bundle:
            identities = await self._bundle_identities(sha, raw_key, body)
        else:
            identity = await self._identity(sha, raw_key, body)
            identities = [identity] if identity is not None else None
        if identities is None:
            return Proof(Verdict.WITHDRAW, "corrupt")
        proof = await self._manifests(raw_key, identities, by_retention=by_retention)
        if proof.verdict is not Verdict.PROVEN:
            return proof
        wanted = {p for i in identities for p in keys.quarantine_identity_prefixes(i)}
        prefixes = (
            list(dict.fromkeys(p for i in identities for p in keys.quarantine_boot_prefixes(i)))
            if bundle
            else keys.quarantine_identity_prefixes(identities[0])
        )
        return await self._quarantines(raw_key, sha, prefixes, wanted, bundle=bundle)

    async def _identity(self, sha: str, blob_key: str, body: bytes) -> keys.BatchIdentity | None:
        problem = None
        if len(body) > self.max_frame_bytes:
            problem = f"{len(body)} bytes, more than max_frame_bytes = {self.max_frame_bytes}"
        else:
            if len(body) >= _HASH_IN_THREAD_BYTES:
                actual = await asyncio.to_thread(lambda: hashlib.sha256(body).hexdigest())
            else:
                actual = hashlib.sha256(body).hexdigest()
            if actual != sha:
                problem = f"hashes to {actual}"
            else:
                try:
                    header = decode_header(body)
                    return keys.BatchIdentity(
                        header.agent_id, header.boot_id, header.seq_start, header.seq_end
                    )
                except (FrameError, keys.KeyFormatError) as exc:
                    problem = f"not a valid frame: {exc}"
        await self._corrupt(blob_key, problem)
        return None

    async def _bundle_identities(
        self, sha: str, bundle_key: str, body: bytes
    ) -> list[keys.BatchIdentity] | None:
        """The identities of the bundle's frames, in order (one per frame), once
        `protocol.bundle.check_bundle` passed: SHA-256 = its name, footer, index CRC, the
        frames parsed end to end from offset 0 tiling the data part and equal to the index
        in order, each frame's CRC and ``frame_sha256``. Else a ``corrupt-blob`` problem
        (never deleted) and None."""
        limit = self._limit("bundle")
        if len(body) > limit:
            problem = f"{len(body)} bytes, more than the largest bundle ({limit})"
        else:
            try:
                if len(body) >= _HASH_IN_THREAD_BYTES:
                    checked = await asyncio.to_thread(check_bundle, body, sha256=sha)
                else:
                    checked = check_bundle(body, sha256=sha)
                return [frame.identity for frame in checked.frames]
            except (BundleError, keys.KeyFormatError) as exc:
                problem = f"not a valid bundle: {exc}"
        await self._corrupt(bundle_key, problem)
        return None

    def _limit(self, kind: str) -> int:
        """The largest valid raw object of ``kind``."""
        if kind == "bundle":
            return self.max_bundle_bytes or self.max_frame_bytes
        return self.max_frame_bytes

    async def _corrupt(self, raw_key: str, problem: str) -> None:
        await self.problems.record(
            "corrupt-blob", raw_key, f"found by the GC's proof (never deleted): {problem}"
        )

    async def _manifests(
        self, raw_key: str, identities: list[keys.BatchIdentity], *, by_retention: bool
    ) -> Proof:
        """Every identity's accepted manifest, at each agent key form: absent (a 404) or
        naming another raw object. A bundle's frames are read ``concurrency`` at once."""
        naming: list[records.AcceptedManifest] = []
        failed: list[Proof] = []

        async def one(key: str) -> None:
            try:
                body, _etag = await self.store.get(key)
            except NotFound:
                return  # absent: only a 404 says so
            try:
                manifest = records.AcceptedManifest.from_json(body, reads_bundles=True)
            except records.RecordError as exc:
                await self.problems.record("unparseable-manifest", key, str(exc))
                failed.append(Proof(Verdict.UNPROVEN, f"{key} does not parse"))
                return
            # By raw object key (PROTOCOL §3.10): a bundled manifest of a frame blob's
            # frame names the bundle, not the blob; for a frame blob's records (no range)
            # the key is the one of their frame_sha256, as before bundles.
            if manifest.raw_blob_key == raw_key:
                naming.append(manifest)

        forms = [
            form
            for identity in dict.fromkeys(identities)
            for form in (
                keys.accepted_manifest_key(identity),
                keys.legacy_accepted_manifest_key(identity),
            )
            if form is not None
        ]
        await for_each_bounded(forms, one, self.concurrency)
        if failed:
            return failed[0]
        if not by_retention:
            return Proof(Verdict.WITHDRAW, "accepted") if naming else PROVEN
        if not naming:
            return Proof(Verdict.WITHDRAW, "raw retention: no manifest names it")
        # A bundle is deleted only whole: every frame whose manifest names it rolled up.
        for manifest in naming:
            if not await self._rolled_up(manifest):
                return Proof(Verdict.WITHDRAW, "raw retention: not in the rollup ledger")
        return PROVEN

    async def _rolled_up(self, manifest: records.AcceptedManifest) -> bool:
        """Whether raw retention still retires the batch's hour and the latest committed
        ledger includes the batch as an included row."""
        async with self._reading:
            if self._retired_before is False:
                try:
                    body, _etag = await self.store.get(keys.RAW_RETENTION_KEY)
                    self._retired_before = records.RawRetention.from_json(body).retired_before
                except (NotFound, records.RecordError):
                    self._retired_before = None
            retired_before = self._retired_before
            if not isinstance(retired_before, str) or not (
                manifest.accepted_hour < keys.UtcHour.parse_iso(retired_before)
            ):
                return False
            if self._snapshot is False:
                try:
                    self._snapshot = await load_latest(self.store)
                except (NotFound, RollupManifestError):
                    self._snapshot = None
            loaded = self._snapshot
            if not isinstance(loaded, LoadedSnapshot):
                return False
            hour = manifest.accepted_hour.iso
            late = loaded.snapshot.ledger_late.get(hour)
            if late is not None and late.batches:
                return False  # which batches were excluded is not recorded per batch
            if hour not in self._ledger_hours:
                try:
                    table = await read_ledger(self.store, loaded.snapshot, {hour})
                except (NotFound, RollupManifestError):
                    return False
                self._ledger_hours[hour] = set(
                    zip(
                        table.column("manifest_id").to_pylist(),
                        table.column("frame_sha256").to_pylist(),
                        strict=True,
                    )
                )
        wanted = (manifest.identity.manifest_id, manifest.frame_sha256)
        return wanted in self._ledger_hours[hour]

    async def _quarantines(
        self, raw_key: str, sha: str, prefixes: list[str], wanted: set[str], *, bundle: bool
    ) -> Proof:
        """One LIST of each prefix (a frame blob: its identity's, per agent key form; a
        bundle: each agent/boot pair's, per form, serving all its frames of that boot) and
        a GET of each record of a ``wanted`` identity. For a frame blob, a record naming it
        (by hash or key) references it. A record naming a bundle is not well-formed
        (§3.10: quarantine records name frame blobs only): the proof fails with an
        ``unparseable-quarantine`` problem, which stops every deletion until it is
        resolved (as rule 5 does for any record not well-formed)."""
        for prefix in prefixes:
            async for info in self.store.list(prefix):
                if info.key.rsplit("/", 1)[0] + "/" not in wanted:
                    continue  # another batch of this boot: not one of the object's frames
                try:
                    body, _etag = await self.store.get(info.key)
                except NotFound:  # records are never deleted: any answer but the record fails
                    return Proof(Verdict.UNPROVEN, f"{info.key} listed but not found")
                try:
                    conflict = records.IdentityConflict.from_json(body)
                except records.RecordError as exc:
                    await self.problems.record("unparseable-quarantine", info.key, str(exc))
                    return Proof(Verdict.UNPROVEN, f"{info.key} does not parse")
                named_keys = (conflict.submitted_raw_blob_key, conflict.accepted_raw_blob_key)
                named_hashes = (conflict.submitted_frame_sha256, conflict.accepted_frame_sha256)
                if raw_key not in named_keys and sha not in named_hashes:
                    continue
                if bundle:
                    await self.problems.record(
                        "unparseable-quarantine",
                        info.key,
                        f"names the bundle {raw_key}: not well-formed (PROTOCOL §3.10, a "
                        "quarantine record names frame blobs only); the bundle is kept",
                    )
                    return Proof(Verdict.UNPROVEN, f"{info.key} names a bundle")
                return Proof(Verdict.WITHDRAW, "quarantined")
        return PROVEN
