"""What the simulation checks: live, as each store operation is applied (`WatchedStore`),
and at the end over the settled store, after a completed full audit (`check_store`).

`WatchedStore` also counts what the tests check the worlds exercise: GC marks, vetoes,
blob deletions and re-creations, index files written, catalog files deleted."""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from chaos.index_checks import RecordFacts, catalog_problems, read_catalog
from chaos.sim_retention import RetentionRule
from protocol import keys, records
from store.base import ObjectInfo, ObjectStore, SignedDelete
from store.errors import NotFound
from store.memory import MemoryStore


class WatchedStore:
    """`MemoryStore` that checks, as each operation is applied, that the GC never deletes
    a referenced blob (with raw retention: one that `RetentionRule` does not let go), no
    manifest or quarantine record is created while its (submitted) blob is missing, and
    no quarantine record says its accepted blob is present while it is missing."""

    def __init__(
        self,
        inner: MemoryStore,
        *,
        violations: list[str],
        stats: Counter[str],
        now_s: Callable[[], float],
    ) -> None:
        self.inner = inner
        self.url = inner.url
        self._violations = violations
        self._stats = stats
        self._now_s = now_s
        self._accepted: dict[str, dict[str, records.AcceptedManifest]] = {}  # sha -> by key
        self._quarantined: dict[str, str] = {}  # sha (submitted or accepted) -> a record key
        self._deleted: set[str] = set()
        self.retention: RetentionRule | None = None
        """With raw retention: when a blob accepted manifests name may still be deleted."""
        self.on_put: Callable[[str, bytes], None] = lambda _key, _body: None
        """Told of every PUT applied (the world watches audits complete)."""
        self.on_delete: Callable[[str], None] = lambda _key: None
        """Told of every DELETE applied (signed or not)."""

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
        if key == keys.RAW_RETENTION_KEY and self.retention is not None:
            if (why := self.retention.why_not_retire(body)) is not None:
                self._violation(why)
        if key.startswith(keys.RAW_BLOBS_PREFIX) and keys.parse_raw_blob_key(key) in self._deleted:
            self._stats["blobs_recreated"] += 1
        sha = None
        if key.startswith(keys.ACCEPTED_PREFIX):
            manifest = records.AcceptedManifest.from_json(body, reads_bundles=True)
            sha = manifest.frame_sha256
            self._accepted.setdefault(sha, {})[key] = manifest
        elif key.startswith(keys.QUARANTINE_PREFIX):
            conflict = records.IdentityConflict.from_json(body)
            sha = conflict.submitted_frame_sha256
            self._quarantined.setdefault(sha, key)
            self._quarantined.setdefault(conflict.accepted_frame_sha256, key)
            await self._check_accepted_blob(key, conflict)
        if sha is not None:
            try:
                await self.inner.head(keys.raw_blob_key(sha))
            except NotFound:
                self._violation(f"{key} was created while its raw blob {sha[:12]} was missing")

    def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        return self.inner.list(prefix, start_after)

    def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        return self.inner.common_prefixes(prefix)

    async def delete(self, key: str) -> None:
        await self._check_delete(key)
        await self.inner.delete(key)
        self.on_delete(key)

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        return await self.inner.sign_delete(key, expires_in_s=expires_in_s)

    async def send_signed_delete(self, request: SignedDelete) -> None:
        await self.inner.send_signed_delete(request)  # raises when refused: nothing deleted
        await self._check_delete(request.key)
        self.on_delete(request.key)

    async def _check_delete(self, key: str) -> None:
        """Only orphans are deleted (PROTOCOL §3.5); with raw retention also blobs that
        only accepted manifests of rolled-up, expired batches name (§4.1), never one a
        quarantine record names. Records are those that exist as the delete applies."""
        if key.startswith(keys.RAW_BLOBS_PREFIX):
            sha = keys.parse_raw_blob_key(key)
            if sha in self._quarantined:
                self._violation(
                    f"GC deleted raw blob {sha[:12]} referenced by {self._quarantined[sha]}"
                )
            elif accepted := self._accepted.get(sha):
                why = (
                    await self.retention.why_not(sha, accepted.values())
                    if self.retention is not None
                    else f"referenced by {next(iter(accepted))}"
                )
                if why is not None:
                    self._violation(f"GC deleted raw blob {sha[:12]}: {why}")
                self._stats["blobs_deleted_accepted"] += 1
            self._stats["blobs_deleted"] += 1
            self._deleted.add(sha)
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
            await self.inner.head(keys.raw_blob_key(conflict.accepted_frame_sha256))
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
) -> list[str]:
    """The end-state invariants over a settled store (after a completed audit).

    ``retired``: manifest_ids whose blobs raw retention may have deleted (in the rollup
    ledger, in a retired hour); every other accepted manifest's blob must exist.
    ``rolled_up``: manifest_ids the committed ledger includes (a rollup that consumes
    work markers: their markers may be gone)."""
    problems: list[str] = []
    present = {info.key async for info in store.list("")}
    manifests: dict[keys.BatchIdentity, records.AcceptedManifest] = {}
    facts: dict[str, RecordFacts] = {}
    for key in sorted(k for k in present if k.startswith(keys.ACCEPTED_PREFIX)):
        manifest = records.AcceptedManifest.from_json((await store.get(key))[0], reads_bundles=True)
        manifests[manifest.identity] = manifest
        facts[key] = RecordFacts("accepted", manifest.frame_sha256, manifest.identity.manifest_id)
        if manifest.identity.manifest_id in retired and (
            keys.raw_blob_key(manifest.frame_sha256) not in present
        ):
            continue
        problems += await _blob_problems(store, present, key, manifest.frame_sha256)
    for key in sorted(k for k in present if k.startswith(keys.QUARANTINE_PREFIX)):
        conflict = records.IdentityConflict.from_json((await store.get(key))[0])
        facts[key] = RecordFacts("quarantine", conflict.submitted_frame_sha256)
        problems += await _blob_problems(store, present, key, conflict.submitted_frame_sha256)
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


async def _blob_problems(store: ObjectStore, present: set[str], key: str, sha: str) -> list[str]:
    blob_key = keys.raw_blob_key(sha)
    if blob_key not in present:
        return [f"raw blob {sha[:12]} referenced by {key} is missing"]
    body, _ = await store.get(blob_key)
    if hashlib.sha256(body).hexdigest() != sha:
        return [f"raw blob {sha[:12]} referenced by {key} does not hash to its name"]
    return []
