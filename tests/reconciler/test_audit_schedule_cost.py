"""What the daemon's audit schedule costs each pass (issue 31: the audit's fixed request
cost): `AuditSchedule.due` finds the audit records once, not twice."""

from __future__ import annotations

from protocol import keys
from protocol.clock import ManualClock
from protocol.records import AuditRecord
from reconciler.audit.records import create_audit
from reconciler.audit.schedule import AuditSchedule
from store.counting import CountingStore
from store.memory import MemoryStore
from tests.reconciler.conftest import context, make_settings


async def test_due_finds_the_audit_records_once(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    store = CountingStore(memory_store)
    settings = make_settings(max_audit_interval_s=3600.0)
    ctx = await context(store, clock, settings=settings)
    now = clock.now_ns()
    for n in range(3):  # completed audits of the index, each with its folder of parts
        start = now - (3 - n) * 60 * keys.NS_PER_S
        record = AuditRecord(audit_id=f"{n:08x}", started_at_unix_ns=start, owner_epoch=ctx.epoch,
                             status="completed", completed_at_unix_ns=start + 1, catalog=True)  # fmt: skip
        await create_audit(ctx, record)
        await memory_store.put(keys.audit_listing_prefix(start, f"{n:08x}") + "plan.json", b"{}")
    schedule = AuditSchedule(settings=settings, metrics=ctx.metrics, progress=None, inventory=None)
    store.clear()

    assert not await schedule.due(ctx)  # the newest completed 3 minutes ago: not due

    # One lookup: a LIST, and one more after each audit's folder (was two lookups).
    assert store.count("list", keys.RECONCILER_AUDITS_PREFIX) == 1 + 3
    assert store.count("get", keys.RECONCILER_AUDITS_PREFIX) == 1
    assert ctx.metrics.last_audit_completed._value.get() == (now - 60 * keys.NS_PER_S + 1) / 1e9
    clock.advance(3600)
    assert await schedule.due(ctx)  # an hour later it is
