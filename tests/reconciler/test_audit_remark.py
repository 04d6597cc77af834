"""A run killed between a catalog file and its rollup work marker (PROTOCOL §3.7: every
catalog file has one): the resumed audit marks that file, so the rollup counts its rows
(`reconciler.audit.remark`; `lm-chaos` ``kill`` found the hole)."""

from __future__ import annotations

from typing import Any

from index import catalog
from protocol import keys
from protocol.clock import ManualClock
from reconciler.audit.run import run_full_audit
from store.errors import Unavailable
from store.memory import MemoryStore
from tests.reconciler.conftest import context, keys_under, write_batches


class MarkersFail(MemoryStore):
    """Every rollup work marker PUT fails while ``failing`` (a process killed right after
    its catalog file was written)."""

    failing = True

    async def put(self, key: str, body: bytes, **conditions: Any) -> str:
        if self.failing and key.startswith(keys.ROLLUP_WORK_PREFIX):
            raise Unavailable("put", key, "killed before the marker")
        return await super().put(key, body, **conditions)


async def test_a_resumed_audit_marks_the_files_a_killed_run_left_unmarked(
    clock: ManualClock,
) -> None:
    store = MarkersFail(clock=clock)
    batches = await write_batches(store, agents=2, per_agent=3)  # no log rows: audit catalogs
    killed = await context(store, clock)
    first = await run_full_audit(killed)
    assert first.status == "running"  # its catalog write failed at the marker
    files = [info.key async for info in catalog.list_all_files(store)]
    assert files and await keys_under(store, keys.ROLLUP_WORK_PREFIX) == set()

    store.failing = False
    clock.advance(1)
    await killed.fence.release()
    resumed = await run_full_audit(await context(store, clock, owner="reconciler-b"))
    assert resumed.status == "completed" and resumed.audit_id == first.audit_id
    markers = await keys_under(store, keys.ROLLUP_WORK_PREFIX)
    assert {keys.rollup_work_marker_key(f) for f in files} <= markers  # the unmarked file too
    cataloged = {row.key for f in files for row in await catalog.read_file(store, f)}
    assert cataloged == {b.key for b in batches}
