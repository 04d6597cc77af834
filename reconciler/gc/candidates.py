"""Step 2 of a GC run: mark the candidates (PROTOCOL §3.5 rule 3, and Candidates).

Candidates: the steady pass's `OrphanSuspects` (``blob`` log rows no record row named)
older than the horizon, and the orphans of the latest completed listing audit (so
orphans whose log row was lost are found too; each audit's orphans are marked once per
process). A candidate is a raw object (PROTOCOL §3.10): its mark records its key, a
bundle's as its ``blob`` log row or the orphan file names it (`RAW_KEY_COLUMNS`), else the
frame blob of its hash. A candidate with no mark and no veto (both known from the run's
one listing of ``gc/v1/marks/`` and ``gc/v1/vetoes/``) gets a ``marked`` mark (If-None-Match). No
per-blob HEAD or LIST here: a run's requests grow with the candidates and the marks. The
run's later steps never read the marks it wrote (younger than the grace: not eligible).
"""

from __future__ import annotations

import io
from collections.abc import Awaitable, Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from protocol import keys, records
from reconciler.audit.orphans import decode_orphans
from reconciler.gc.bounded import for_each_bounded
from reconciler.gc.suspects import Suspect
from reconciler.gc.work import GcWork
from store.errors import PreconditionFailed

OrphanFile = dict[str, tuple[int, int, bool]]
"""``{sha: (size, last_modified_ns, raw_retention)}`` (`reconciler.audit.orphans`)."""
Suspects = Callable[[int], list[Suspect]]
"""Raw objects (hash, creation time, key) a log says nobody referenced, created before the
given time, handed over once (`reconciler.gc.suspects.OrphanSuspects.take_older_than`)."""
LatestAudit = Callable[[], Awaitable[records.AuditRecord | None]]


RAW_KEY_COLUMNS = ("raw_key", "raw_blob_key")
"""The orphan file's column naming each row's raw object, the first present of these (the
audit's SQL calls it ``raw_key``, the catalog ``raw_blob_key``): a bundle's key for a
bundle (PROTOCOL §3.10); absent or null: the frame blob of the row's hash (files written
before bundles)."""


def orphan_raw_keys(body: bytes) -> dict[str, str]:
    """``{sha: raw object key}`` of an orphan file's rows that name their raw object; the
    others are frame blobs. Raises `ValueError` when unreadable."""
    try:
        parquet = pq.ParquetFile(io.BytesIO(body))
        names = parquet.schema_arrow.names
        column = next((name for name in RAW_KEY_COLUMNS if name in names), None)
        if column is None:
            return {}
        table = parquet.read(columns=["frame_sha256", column])
    except (pa.ArrowException, OSError, KeyError) as exc:
        raise ValueError(f"unreadable orphan file: {exc}") from None
    table = table.filter(pc.is_valid(table.column(column)))
    return dict(
        zip(
            table.column("frame_sha256").to_pylist(),
            table.column(column).to_pylist(),
            strict=True,
        )
    )


def checked_raw_key(sha: str, raw_key: str | None) -> str:
    """The raw object key of candidate ``sha``: ``raw_key`` when it is a canonical raw
    object key of that hash (a bundle's), else the frame blob of ``sha``."""
    if raw_key is not None:
        try:
            if keys.parse_raw_object_key(raw_key)[1] == sha:
                return raw_key
        except keys.KeyFormatError:
            pass
    return keys.raw_blob_key(sha)


class OrphanFiles:
    """The orphan files of audits, each read once per run."""

    def __init__(self, work: GcWork) -> None:
        self._work = work
        self._read: dict[str, OrphanFile] = {}
        self.raw_keys: dict[str, str] = {}
        """``{sha: raw object key}`` of the bundles the files read name."""

    async def of(self, audit: records.AuditRecord) -> OrphanFile:
        key = keys.audit_orphans_key(audit.started_at_unix_ns, audit.audit_id)
        if key not in self._read:
            body, _etag = await self._work.store.get(key)
            self._read[key] = decode_orphans(body)
            self.raw_keys.update(orphan_raw_keys(body))
        return self._read[key]


async def list_marks_and_vetoes(work: GcWork) -> None:
    work.marks, work.vetoes = set(), set()
    async for info in work.store.list(keys.GC_MARKS_PREFIX):
        work.marks.add(info.key.removeprefix(keys.GC_MARKS_PREFIX).removesuffix(".json"))
    async for info in work.store.list(keys.GC_VETOES_PREFIX):
        work.vetoes.add(info.key.removeprefix(keys.GC_VETOES_PREFIX).removesuffix(".json"))


async def mark_candidates(
    work: GcWork,
    *,
    suspects: Suspects,
    audit: records.AuditRecord | None,
    orphans: OrphanFiles,
    audits_marked: set[str],
    run_id: str,
    dry_run: bool,
) -> dict[str, int]:
    horizon_ns = work.clock.now_ns() - work.policy.horizon_ns
    # A dry run leaves the suspects for the next real run (taking them hands them over).
    taken = [] if dry_run else suspects(horizon_ns)
    candidates: dict[str, records.GcReason] = {sha: "orphan" for sha, _at, _key in taken}
    suspect_keys = {sha: raw_key for sha, _at, raw_key in taken}
    if audit is not None and audit.audit_id not in audits_marked:
        for sha, (_size, _modified, by_retention) in (await orphans.of(audit)).items():
            candidates[sha] = "raw-retention" if by_retention else "orphan"
        if not dry_run:
            audits_marked.add(audit.audit_id)
    elif audit is not None:
        await orphans.of(audit)  # its raw keys: a suspect may be one of its bundles
    counts = {"candidates": len(candidates), "marked": 0, "vetoed": 0}
    to_mark: list[tuple[str, records.GcReason]] = []
    for sha, reason in sorted(candidates.items()):
        if sha in work.vetoes:
            counts["vetoed"] += 1
        elif sha not in work.marks and not dry_run:
            to_mark.append((sha, reason))

    async def mark(item: tuple[str, records.GcReason]) -> None:
        sha, reason = item
        record = records.GcMark(
            frame_sha256=sha,  # the raw object's hash (a bundle's for a bundle)
            # Marks record the object's key (PROTOCOL §3.10): the rules act on it.
            raw_blob_key=checked_raw_key(sha, orphans.raw_keys.get(sha, suspect_keys.get(sha))),
            marked_at_unix_ns=work.clock.now_ns(),
            gc_run_id=run_id,
            reason=reason,
        )
        await work.fence()
        try:
            await work.store.put(keys.gc_mark_key(sha), record.to_json(), if_none_match=True)
            counts["marked"] += 1
            # Not added to work.marks: a mark this run wrote is younger than the grace
            # (> 0), so step 3 would read it back only to find it not yet eligible.
        except PreconditionFailed:
            pass

    await for_each_bounded(
        to_mark,
        lambda item: work.per_item("mark", item[0], mark(item)),
        work.policy.concurrency,
    )
    work.observe("candidates", counts["candidates"])
    work.observe("marks", counts["marked"])
    work.observe("vetoes", counts["vetoed"])
    return counts
