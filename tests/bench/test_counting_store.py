"""`bench.counting_store.CountingStore.scope`: the requests made within a scope (and by the
tasks started in it) are counted apart; those of tasks started before it are not."""

from __future__ import annotations

import asyncio

from bench.counting_store import CountingStore
from store.memory import MemoryStore


async def test_a_scope_counts_its_own_requests_and_its_tasks_but_not_earlier_tasks() -> None:
    store = CountingStore(MemoryStore())
    release = asyncio.Event()

    async def background() -> None:  # started before the scope: a daemon's audit, say
        await release.wait()
        await store.put("reconciler/v1/audits/a.json", b"{}")

    earlier = asyncio.create_task(background())
    with store.scope("gc-1") as tally:
        await store.put("gc/v1/marks/x.json", b"{}", if_none_match=True)
        release.set()
        await earlier  # runs while the scope is open, in its own context
        await asyncio.gather(store.get("gc/v1/marks/x.json"), store.head("gc/v1/marks/x.json"))
        child = asyncio.create_task(store.delete("gc/v1/marks/x.json"))
        await child
    await store.put("gc/v1/marks/y.json", b"{}")  # after the scope

    assert dict(tally) == {
        ("put_if_none_match", "gc/marks"): 1,
        ("get", "gc/marks"): 1,
        ("head", "gc/marks"): 1,
        ("delete", "gc/marks"): 1,
    }
    assert store.tally[("put", "reconciler/audits")] == 1  # counted, but not in the scope
    assert store.tally[("put", "gc/marks")] == 1
    assert store.scoped == {"gc-1": tally}
