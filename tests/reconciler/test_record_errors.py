"""A store exception that is not a `StoreError` fails one record, not a steady pass or an
audit (before: it escaped ``asyncio.gather`` and ended the stage, so an audit that met
one such record crashed on every pass and the GC, waiting for an audit, never ran)."""

from __future__ import annotations

from protocol.clock import ManualClock
from reconciler.audit.run import latest_completed_audit, run_full_audit
from reconciler.steady import SteadyScanner
from store.memory import MemoryStore
from tests.reconciler.conftest import catalog_keys, context, log_rows, write_batches


class ExplodingStore(MemoryStore):
    """Raises a plain exception on any call about ``victim`` (as a store meeting a key it
    cannot take, or a bug in a wrapper, would) while ``armed``."""

    def __init__(self, victim: str, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.victim = victim
        self.armed = True

    def _check(self, key: str) -> None:
        if self.armed and key.startswith(self.victim):
            raise RuntimeError(f"cannot handle {key!r}")

    async def get(self, key: str) -> tuple[bytes, str]:
        self._check(key)
        return await super().get(key)

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        self._check(key)
        return await super().put(key, body, if_none_match=if_none_match, if_match=if_match)


async def test_an_audit_fails_only_the_record_whose_store_call_raised(clock: ManualClock) -> None:
    store = ExplodingStore("", clock)
    store.armed = False
    batches = await write_batches(store, agents=3, per_agent=4)  # no log rows: the audit finds them
    victim = batches[5]
    store.victim, store.armed = victim.key, True
    ctx = await context(store, clock)

    failed = await run_full_audit(ctx, progress_interval_s=0)

    assert failed.status == "running"  # not done: the next audit redoes the record
    assert failed.manifests_seen == len(batches)
    assert ctx.metrics.store_failures.labels("catalog_read")._value.get() == 1
    cataloged = await catalog_keys(store)
    assert {b.key for b in batches if b is not victim} <= cataloged
    assert victim.key not in cataloged
    assert await latest_completed_audit(store) is None

    store.armed = False
    again = await run_full_audit(ctx, progress_interval_s=0)
    assert again.status == "completed"
    assert victim.key in await catalog_keys(store)
    assert await latest_completed_audit(store) == again


async def test_a_steady_pass_fails_only_the_record_whose_store_call_raised(
    clock: ManualClock,
) -> None:
    store = ExplodingStore("", clock)
    store.armed = False
    batches = await write_batches(store, agents=2, per_agent=3)
    await log_rows(store, clock, batches)
    victim = batches[1]
    store.victim, store.armed = victim.key, True
    scanner = SteadyScanner(await context(store, clock))

    result = await scanner.run_pass()

    assert not result.complete and result.failed == 1
    assert result.records_read == len(batches)
    cataloged = await catalog_keys(store)
    assert {b.key for b in batches if b is not victim} <= cataloged
    assert victim.key not in cataloged
    store.armed = False
    assert (await scanner.run_pass()).complete
    assert victim.key in await catalog_keys(store)
