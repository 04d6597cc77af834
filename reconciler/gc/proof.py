"""Rule 7 of PROTOCOL §3.5, the targeted proof: no well-formed record references blob B.

A blob is content-addressed and its header carries its identity I, so the only records
that can reference B are I's accepted manifest and I's quarantine records. `TargetedProof`
checks exactly those, a few requests per candidate and never a listing of history:

1. B is read whole (a candidate is an orphan: few, each at most ``max_frame_bytes``); its
   SHA-256 must equal its name and its header (CRC included) must decode
   (`protocol.frame.decode_header`). A blob that fails is never deleted: a ``corrupt-blob``
   problem, and the mark is withdrawn.
2. The accepted manifest of I, at each agent key form (`keys.accepted_manifest_key` and
   `keys.legacy_accepted_manifest_key`): "absent" is a 404 only. A manifest naming B
   means B is referenced (the mark is withdrawn); one that does not parse fails the proof
   (``unparseable-manifest``; any other error propagates and the candidate is skipped).
3. One LIST of I's quarantine prefix per agent form (`keys.quarantine_identity_prefixes`),
   normally empty, and a GET of each record: one naming B as its submitted or accepted
   blob means B is referenced; one that does not parse fails the proof
   (``unparseable-quarantine``).

**Raw retention's variant**, only for blobs raw retention nominates (the audit's orphan
file flags them): step 2 reads instead "the manifest of I names B, and the latest
committed rollup ledger includes (I, B)": a ledger row of the manifest's accepted hour with
I's ``manifest_id`` and B's hash. The nomination must also still stand: the manifest's
hour is before ``gc/v1/raw-retention.json``'s ``retired_before`` (an operator who deleted
that state to keep the blobs stops the deletions at once, not at the next audit). Ledger rows do not say which batches of an hour were
*late, excluded* (counted per hour only, `rollup.table.manifest.Snapshot.ledger_late`), so a
batch of an hour with any late-excluded batch cannot be shown included: its blob is kept
(the conservative reading; PROTOCOL could give ledger rows a status). Step 3 is unchanged.

Each `TargetedProof` is one GC run's: it reads the rollup snapshot once and each ledger
hour once.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
from dataclasses import dataclass, field

from protocol import keys, records
from protocol.frame import FrameError, decode_header
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
    _snapshot: LoadedSnapshot | bool | None = False  # False: not read yet
    _retired_before: str | bool | None = False
    _ledger_hours: dict[str, set[tuple[str, str]]] = field(default_factory=dict)
    _reading: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def prove(self, sha: str, *, by_retention: bool) -> Proof:
        """The targeted proof for blob ``sha`` (see the module docstring). Store errors
        other than a 404 propagate: nothing is decided."""
        blob_key = keys.raw_blob_key(sha)
        try:
            body, _etag = await self.store.get(blob_key)
        except NotFound:
            return Proof(Verdict.WITHDRAW, "gone")
        identity = await self._identity(sha, blob_key, body)
        if identity is None:
            return Proof(Verdict.WITHDRAW, "corrupt")
        proof = await self._manifests(sha, identity, by_retention=by_retention)
        if proof.verdict is not Verdict.PROVEN:
            return proof
        return await self._quarantines(sha, identity)

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
        await self.problems.record(
            "corrupt-blob", blob_key, f"found by the GC's proof (never deleted): {problem}"
        )
        return None

    async def _manifests(
        self, sha: str, identity: keys.BatchIdentity, *, by_retention: bool
    ) -> Proof:
        naming: list[records.AcceptedManifest] = []
        forms = [keys.accepted_manifest_key(identity), keys.legacy_accepted_manifest_key(identity)]
        for key in [form for form in forms if form is not None]:
            try:
                body, _etag = await self.store.get(key)
            except NotFound:
                continue  # absent: only a 404 says so
            try:
                manifest = records.AcceptedManifest.from_json(body, reads_bundles=True)
            except records.RecordError as exc:
                await self.problems.record("unparseable-manifest", key, str(exc))
                return Proof(Verdict.UNPROVEN, f"{key} does not parse")
            if manifest.frame_sha256 == sha:
                naming.append(manifest)
        if not by_retention:
            return Proof(Verdict.WITHDRAW, "accepted") if naming else PROVEN
        if not naming:
            return Proof(Verdict.WITHDRAW, "raw retention: no manifest names it")
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

    async def _quarantines(self, sha: str, identity: keys.BatchIdentity) -> Proof:
        for prefix in keys.quarantine_identity_prefixes(identity):
            async for info in self.store.list(prefix):
                try:
                    body, _etag = await self.store.get(info.key)
                except NotFound:  # records are never deleted: any answer but the record fails
                    return Proof(Verdict.UNPROVEN, f"{info.key} listed but not found")
                try:
                    conflict = records.IdentityConflict.from_json(body)
                except records.RecordError as exc:
                    await self.problems.record("unparseable-quarantine", info.key, str(exc))
                    return Proof(Verdict.UNPROVEN, f"{info.key} does not parse")
                if sha in (conflict.submitted_frame_sha256, conflict.accepted_frame_sha256):
                    return Proof(Verdict.WITHDRAW, "quarantined")
        return PROVEN
