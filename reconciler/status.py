"""``lm-reconciler status``: what the reconciler has done, read from the store (no lease).

Lag is defined in `reconciler.steady`: the hours of ``accepted-by-time/v1/`` data (up to
the current hour) that the checkpoint does not cover; ``lag_seconds`` is the same at hour
granularity. 0 means every existing hour has been scanned by a pass, the current hour as
of ``checkpoint.updated_at``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from protocol import keys
from protocol.clock import Clock
from protocol.records import (
    AuditRecord,
    GcRunRecord,
    LeaseRecord,
    ReconcilerCheckpoint,
    RecordError,
)
from store.base import ObjectStore
from store.errors import NotFound

from .audit_records import latest_audit, latest_completed_audit
from .listing import hours_with_entries
from .problems import count_problems
from .steady import lag_hours, read_checkpoint


@dataclass(frozen=True)
class ReconcilerStatus:
    store_url: str
    now_unix_ns: int
    checkpoint: ReconcilerCheckpoint | None
    oldest_hour: keys.UtcHour | None
    newest_hour: keys.UtcHour | None
    lag_hours: int
    lease: LeaseRecord | None
    last_audit: AuditRecord | None
    last_completed_audit: AuditRecord | None
    last_gc: GcRunRecord | None
    problems: Counter[str]

    @property
    def lease_active(self) -> bool:
        return self.lease is not None and self.lease.expires_at_unix_ns > self.now_unix_ns

    @property
    def healthy(self) -> bool:
        """Zero lag and zero problems: the condition ``status --check`` tests."""
        return self.lag_hours == 0 and not sum(self.problems.values())

    def to_json(self) -> dict[str, Any]:
        checkpoint = self.checkpoint
        return {
            "store": self.store_url,
            "now": _iso(self.now_unix_ns),
            "checkpoint": None
            if checkpoint is None
            else {
                "next_hour": checkpoint.next_hour,
                "updated_at": _iso(checkpoint.updated_at_unix_ns),
                "owner_epoch": checkpoint.owner_epoch,
            },
            "checkpoint_age_seconds": None
            if checkpoint is None
            else round((self.now_unix_ns - checkpoint.updated_at_unix_ns) / 1e9, 3),
            "newest_hour": self.newest_hour.iso if self.newest_hour else None,
            "lag_hours": self.lag_hours,
            "lag_seconds": self.lag_hours * 3600,
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
        }

    def render(self) -> str:
        doc = self.to_json()
        checkpoint = doc["checkpoint"]
        lines = [f"store           {self.store_url}"]
        if checkpoint is None:
            lines.append("checkpoint      none (no steady-state pass yet)")
        else:
            lines.append(
                f"checkpoint      next hour {checkpoint['next_hour']}, updated "
                f"{checkpoint['updated_at']} ({doc['checkpoint_age_seconds']}s ago)"
            )
        lines.append(
            f"lag             {self.lag_hours} h ({doc['lag_seconds']} s); newest hour "
            f"{doc['newest_hour'] or 'none'}"
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
            + (f", refused: {gc['refused']}" if gc.get("refused") else "")
        )
        problems = doc["problems"]
        detail = ", ".join(f"{k} {v}" for k, v in sorted(problems["by_kind"].items()))
        lines.append(f"problems        {problems['total']}" + (f" ({detail})" if detail else ""))
        return "\n".join(lines)


async def gather_status(store: ObjectStore, clock: Clock) -> ReconcilerStatus:
    """Read everything `ReconcilerStatus` shows. Raises store errors."""
    now = clock.now_ns()
    now_hour = keys.UtcHour.from_unix_ns(now)
    try:
        checkpoint = await read_checkpoint(store)
    except RecordError:
        checkpoint = None
    first = keys.UtcHour.parse_iso(checkpoint.next_hour) if checkpoint else None
    oldest: keys.UtcHour | None = None
    newest: keys.UtcHour | None = None
    async for hour in hours_with_entries(
        store, keys.ACCEPTED_BY_TIME_PREFIX, first=first, last=now_hour
    ):
        oldest = oldest or hour
        newest = hour
    return ReconcilerStatus(
        store_url=store.url,
        now_unix_ns=now,
        checkpoint=checkpoint,
        oldest_hour=oldest,
        newest_hour=newest,
        lag_hours=lag_hours(first, oldest, newest),
        lease=await _read_lease(store),
        last_audit=await latest_audit(store),
        last_completed_audit=await latest_completed_audit(store),
        last_gc=await _latest_gc_run(store),
        problems=await count_problems(store),
    )


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
        "repaired": record.repaired,
        "problems": record.problems,
    }


def _audit_line(audit: dict[str, Any] | None) -> str:
    if audit is None:
        return "none"
    when = audit["completed_at"] or f"started {audit['started_at']}"
    return (
        f"{audit['audit_id']} {audit['status']} ({audit['source']}) {when}: "
        f"{audit['manifests_seen']} manifests, {audit['quarantines_seen']} quarantined, "
        f"{sum(audit['repaired'].values())} repaired, {audit['problems']} problems"
    )


def _iso(unix_ns: int) -> str:
    return datetime.fromtimestamp(unix_ns / 1e9, tz=UTC).isoformat(timespec="seconds")
