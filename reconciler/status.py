"""``lm-reconciler status``: what the reconciler has done, read from the store (no lease).

- **log**: the steady pass's position (`IndexCheckpoint`) and how many log segments
  are waiting behind it (one listing from the position: never all of history);
- **catalog**: catalog hours and files (one listing of ``index/v1/catalog/``: files are
  few per hour once compacted) and the rollup work markers waiting;
- **cost**: index requests per accepted batch from the checkpoint's cumulative totals —
  (segments + catalog files + markers + checkpoint writes) / accepted rows — the figure
  PROTOCOL §3.7 asks to stay at or below 0.05;
- the lease, the last audit and the last completed one, the last GC run, problems;
- **bundles**: the store's feature record (PROTOCOL §3.10; one GET).

``healthy`` (``status --check``): no segment waiting longer than the lookback, and no
problem records.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from index.features import FeatureReader, FeatureRecordError, unimplemented
from index.log_reader import LogPosition, new_segments
from protocol import keys
from protocol.clock import Clock
from protocol.records import (
    AuditRecord,
    FeatureRecord,
    GcRunRecord,
    IndexCheckpoint,
    LeaseRecord,
    RawRetention,
    RecordError,
)
from reconciler.audit.records import latest_audit, latest_completed_audit
from reconciler.bundle_status import bundle_bytes, bundle_line
from reconciler.gc.raw_retention import read_state
from reconciler.log_lag import lag_seconds
from reconciler.problems import count_problems
from reconciler.steady import read_checkpoint
from store.base import ObjectStore
from store.errors import NotFound

INDEX_PUT_TOTALS = ("segments", "catalog_files", "markers", "checkpoints")


@dataclass(frozen=True)
class ReconcilerStatus:
    store_url: str
    now_unix_ns: int
    checkpoint: IndexCheckpoint | None
    segments_behind: int
    oldest_waiting_ns: int | None
    catalog_hours: int
    catalog_files: int
    work_markers: int
    lookback_s: float
    lease: LeaseRecord | None
    last_audit: AuditRecord | None
    last_completed_audit: AuditRecord | None
    last_gc: GcRunRecord | None
    problems: Counter[str]
    raw_retention: RawRetention | None = None
    catalog_created: int = 0
    """``index/v1/catalog-created/`` entries kept (those since the last completed audit's
    start: the GC reads them; older ones are deleted by the GC)."""
    features: FeatureRecord | None = None
    """The store's feature record (None: absent or unreadable: bundles off)."""

    @property
    def lease_active(self) -> bool:
        return self.lease is not None and self.lease.expires_at_unix_ns > self.now_unix_ns

    @property
    def lag_seconds(self) -> float:
        """How long the oldest waiting segment has waited (0: nothing waits)."""
        return lag_seconds(self.now_unix_ns, self.oldest_waiting_ns)

    @property
    def index_requests_per_batch(self) -> float | None:
        totals = self.checkpoint.totals if self.checkpoint else {}
        accepted = totals.get("accepted_rows", 0)
        if not accepted:
            return None
        return sum(totals.get(name, 0) for name in INDEX_PUT_TOTALS) / accepted

    @property
    def healthy(self) -> bool:
        """Nothing waits longer than the lookback and no problems: ``status --check``."""
        return self.lag_seconds <= self.lookback_s and not sum(self.problems.values())

    def to_json(self) -> dict[str, Any]:
        checkpoint = self.checkpoint
        return {
            "store": self.store_url,
            "now": _iso(self.now_unix_ns),
            "log": {
                "through": _iso(checkpoint.log_through_ns) if checkpoint else None,
                "updated_at": _iso(checkpoint.updated_at_unix_ns) if checkpoint else None,
                "owner_epoch": checkpoint.owner_epoch if checkpoint else None,
                "segments_behind": self.segments_behind,
                "lag_seconds": round(self.lag_seconds, 3),
                "totals": dict(checkpoint.totals) if checkpoint else {},
                "etags_attest": checkpoint.etags_attest if checkpoint else None,
            },
            "catalog": {
                "hours": self.catalog_hours,
                "files": self.catalog_files,
                "rollup_work_markers": self.work_markers,
                "catalog_created_entries": self.catalog_created,
            },
            "index_requests_per_batch": None
            if self.index_requests_per_batch is None
            else round(self.index_requests_per_batch, 4),
            "lease": None
            if self.lease is None
            else {
                "owner": self.lease.owner,
                "epoch": self.lease.epoch,
                "expires_at": _iso(self.lease.expires_at_unix_ns),
                "active": self.lease_active,
            },
            "last_audit": _audit_json(self.last_audit),
            "last_completed_audit": _audit_json(self.last_completed_audit),
            "last_gc": None
            if self.last_gc is None
            else {
                **self.last_gc.model_dump(mode="json", exclude={"schema_"}),
                "started_at": _iso(self.last_gc.started_at_unix_ns),
            },
            "problems": {"total": sum(self.problems.values()), "by_kind": dict(self.problems)},
            "raw_retention": None
            if self.raw_retention is None
            else self.raw_retention.model_dump(mode="json", exclude={"schema_"}),
            "bundle_bytes": bundle_bytes(self.last_completed_audit),
            "features": None
            if self.features is None
            else {
                "bundles": self.features.bundles,
                "written_by": self.features.written_by,
                "written_at": _iso(self.features.written_at_unix_ns),
                "unimplemented": unimplemented(self.features),
            },
        }

    def render(self) -> str:
        doc = self.to_json()
        log, cat = doc["log"], doc["catalog"]
        lines = [f"store           {self.store_url}"]
        lines.append(
            "log             no steady pass yet"
            if log["through"] is None
            else f"log             through {log['through']} (updated {log['updated_at']}); "
            f"{log['segments_behind']} segments waiting, lag {log['lag_seconds']} s"
        )
        lines.append(
            f"catalog         {cat['hours']} hours in {cat['files']} files; "
            f"{cat['rollup_work_markers']} rollup work markers waiting; "
            f"{cat['catalog_created_entries']} catalog-created entries"
        )
        if log["etags_attest"] is False:
            lines.append(
                "store ETags     PUT, HEAD and LIST disagree: the steady pass reads back "
                "every record (PROTOCOL §3.6)"
            )
        totals = log["totals"]
        if totals.get("accepted_rows"):
            read = totals.get("records_read", 0) / totals["accepted_rows"]
            lines.append(f"read-backs      {read:.4f} record GETs per accepted row")
        cost = doc["index_requests_per_batch"]
        lines.append(
            "index cost      "
            + ("n/a (no batches yet)" if cost is None else f"{cost} requests per accepted batch")
        )
        lease = doc["lease"]
        lines.append(
            "lease           none"
            if lease is None
            else f"lease           {lease['owner']} epoch {lease['epoch']} "
            f"{'active until' if lease['active'] else 'expired at'} {lease['expires_at']}"
        )
        lines.append(f"last audit      {_audit_line(doc['last_audit'])}")
        lines.append(f"last completed  {_audit_line(doc['last_completed_audit'])}")
        gc = doc["last_gc"]
        lines.append(
            "last GC         none"
            if gc is None
            else f"last GC         {gc['run_id']} started {gc['started_at']}: "
            f"{gc['candidates']} candidates, {gc['marked']} marked, {gc['vetoed']} vetoed, "
            f"{gc['deleted']} deleted{' (dry run)' if gc['dry_run'] else ''}"
            + (
                f" ({gc['deleted_raw_retention']} by raw retention)"
                if gc.get("deleted_raw_retention")
                else ""
            )
            + (f", refused: {gc['refused']}" if gc.get("refused") else "")
            + (
                f", STALLED ({gc['stalled']}): its catalog read proved nothing, nothing deleted"
                if gc.get("stalled")
                else ""
            )
        )
        raw = doc["raw_retention"]
        lines.append(
            "raw retention   nothing retired"
            if raw is None
            else f"raw retention   accepted hours before {raw['retired_before']} retired "
            f"({raw['retired_batches']} batches; raw_days {raw['raw_days']:g})"
        )
        if (bundles := doc["bundle_bytes"]) is not None:
            lines.append(f"bundle bytes    {bundle_line(bundles)}")
        features = doc["features"]
        lines.append(
            f"bundles         on since {features['written_at']} (by {features['written_by']})"
            if features and features["bundles"]
            else "bundles         off (`lm-reconciler enable-bundles` turns them on)"
        )
        problems = doc["problems"]
        detail = ", ".join(f"{k} {v}" for k, v in sorted(problems["by_kind"].items()))
        lines.append(f"problems        {problems['total']}" + (f" ({detail})" if detail else ""))
        return "\n".join(lines)


async def gather_status(store: ObjectStore, clock: Clock, *, lookback_s: float) -> ReconcilerStatus:
    """Read everything `ReconcilerStatus` shows. Raises store errors."""
    try:
        checkpoint = await read_checkpoint(store)
    except RecordError:
        checkpoint = None
    position = (
        LogPosition(checkpoint.log_through_ns, set(checkpoint.log_seen))
        if checkpoint
        else LogPosition()
    )
    behind, oldest = 0, None
    async for _info, name in new_segments(store, position, lookback_s=lookback_s):
        behind += 1
        oldest = name.time_ns if oldest is None else min(oldest, name.time_ns)
    hours: set[str] = set()
    files = 0
    async for info in store.list(keys.INDEX_CATALOG_PREFIX):
        files += 1
        hours.add(info.key.rsplit("/", 1)[0])
    markers = 0
    async for _marker in store.list(keys.ROLLUP_WORK_PREFIX):
        markers += 1
    created = 0
    async for _entry in store.list(keys.INDEX_CATALOG_CREATED_PREFIX):
        created += 1
    return ReconcilerStatus(
        store_url=store.url,
        now_unix_ns=clock.now_ns(),
        checkpoint=checkpoint,
        segments_behind=behind,
        oldest_waiting_ns=oldest,
        catalog_hours=len(hours),
        catalog_files=files,
        work_markers=markers,
        lookback_s=lookback_s,
        lease=await _read_lease(store),
        last_audit=await latest_audit(store),
        last_completed_audit=await latest_completed_audit(store),
        last_gc=await _latest_gc_run(store),
        problems=await count_problems(store),
        raw_retention=await _raw_retention(store),
        catalog_created=created,
        features=await _read_features(store),
    )


async def _read_features(store: ObjectStore) -> FeatureRecord | None:
    try:
        return await FeatureReader(store).read()
    except FeatureRecordError:
        return None


async def _raw_retention(store: ObjectStore) -> RawRetention | None:
    try:
        return (await read_state(store))[0]
    except RecordError:
        return None


async def _read_lease(store: ObjectStore) -> LeaseRecord | None:
    try:
        body, _etag = await store.get(keys.RECONCILER_LEASE_KEY)
        return LeaseRecord.from_json(body)
    except (NotFound, RecordError):
        return None


async def _latest_gc_run(store: ObjectStore) -> GcRunRecord | None:
    last: str | None = None
    async for info in store.list(keys.RECONCILER_GC_RUNS_PREFIX):
        last = info.key
    if last is None:
        return None
    try:
        body, _etag = await store.get(last)
        return GcRunRecord.from_json(body)
    except (NotFound, RecordError):
        return None


def _audit_json(record: AuditRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    return {
        "audit_id": record.audit_id,
        "status": record.status,
        "source": record.source,
        "started_at": _iso(record.started_at_unix_ns),
        "completed_at": _iso(record.completed_at_unix_ns)
        if record.completed_at_unix_ns is not None
        else None,
        "manifests_seen": record.manifests_seen,
        "quarantines_seen": record.quarantines_seen,
        "cataloged": record.cataloged,
        "blobs_listed": record.blobs_listed,
        "orphans": record.orphans,
        "problems": record.problems,
        "engine": record.engine,
        "duration_s": (record.completed_at_unix_ns - record.ran_from_unix_ns) / 1e9
        if record.completed_at_unix_ns is not None and record.ran_from_unix_ns is not None
        else None,
        "keys_listed": dict(record.keys_listed),
        "requests": dict(record.requests),
        "spilled_bytes": record.spilled_bytes,
    }


def _audit_line(audit: dict[str, Any] | None) -> str:
    if audit is None:
        return "none"
    when = audit["completed_at"] or f"started {audit['started_at']}"
    return (
        f"{audit['audit_id']} {audit['status']} ({audit['source']}) {when}: "
        f"{audit['manifests_seen']} manifests, {audit['quarantines_seen']} quarantined, "
        f"{audit['cataloged']} cataloged, {audit['blobs_listed']} blobs listed, "
        f"{audit['orphans'] if audit['orphans'] is not None else '-'} orphans, "
        f"{audit['problems']} problems{_audit_cost(audit)}"
    )


def _audit_cost(audit: dict[str, Any]) -> str:
    """``; engine local, 812 s, listed accepted=…, requests LIST=… GET=…, spilled 1.2 GiB``."""
    parts = [f"engine {audit['engine']}"]
    if audit["duration_s"] is not None:
        parts.append(f"{audit['duration_s']:.0f} s")
    if audit["keys_listed"]:
        parts.append(
            "listed " + " ".join(f"{k}={v}" for k, v in sorted(audit["keys_listed"].items()))
        )
    if audit["requests"]:
        parts.append(
            "requests " + " ".join(f"{k}={v}" for k, v in sorted(audit["requests"].items()))
        )
    if audit["spilled_bytes"]:
        parts.append(f"spilled {audit['spilled_bytes'] / 2**20:.1f} MiB")
    return "; " + ", ".join(parts)


def _iso(unix_ns: int) -> str:
    return datetime.fromtimestamp(unix_ns / 1e9, tz=UTC).isoformat(timespec="seconds")
