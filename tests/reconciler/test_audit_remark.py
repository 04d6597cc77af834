"""A run killed between a catalog file and its rollup work marker (PROTOCOL §3.7: every
catalog file has one): the resumed audit, or a new one started after the killed one's pin
lapsed, marks that file, so the rollup counts its rows (`reconciler.audit.remark`;
`lm-chaos` ``kill`` found the hole)."""

from __future__ import annotations

from typing import Any

import pytest

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


@pytest.mark.parametrize("pin_lapsed", [False, True], ids=["resumed", "restarted"])
async def test_the_next_audit_marks_the_files_a_killed_run_left_unmarked(
    clock: ManualClock, pin_lapsed: bool
) -> None:
    store = MarkersFail(clock=clock)
    batches = await write_batches(store, agents=2, per_agent=3)  # no log rows: audit catalogs
    killed = await context(store, clock)
    first = await run_full_audit(killed)
    assert first.status == "running"  # its catalog write failed at the marker
    files = [info.key async for info in catalog.list_all_files(store)]
    assert files and await keys_under(store, keys.ROLLUP_WORK_PREFIX) == set()

    store.failing = False
    await killed.fence.release()
    settings = killed.settings.reconciler
    clock.advance(settings.audit_pin_s + 1 if pin_lapsed else 1)
    after = await run_full_audit(await context(store, clock, owner="reconciler-b"))
    assert after.status == "completed"
    assert (after.started_at_unix_ns != first.started_at_unix_ns) == pin_lapsed  # a new audit
    markers = await keys_under(store, keys.ROLLUP_WORK_PREFIX)
    assert {keys.rollup_work_marker_key(f) for f in files} <= markers  # the unmarked file too
    cataloged = {row.key for f in files for row in await catalog.read_file(store, f)}
    assert cataloged == {b.key for b in batches}
