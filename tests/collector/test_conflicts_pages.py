"""``GET /v1/conflicts`` reads a bounded page per request (issue 31 item 7, PROTOCOL §2).

Through the in-process app over a memory store holding quarantine records written
straight into it (as a collector writes them, not yet cataloged): a request GETs at most
``limit`` records whatever ``since`` leaves out, its ``next`` resumes the listing after
the last key read, and a walk by ``next`` reads every record exactly once. ``after`` is
network input: anything but a quarantine key under the prefixes listed is 400 naming it.
``lm-collector conflicts`` follows the same pages.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import collector.__main__ as collector_cli
from collector import conflicts_api
from protocol import keys, records
from store.errors import Unavailable
from store.fs import FileSystemStore
from store.memory import MemoryStore
from tests.collector.conftest import BOOT, Answer, get
from tests.collector.inprocess import ADMIN_TOKEN, InProcessCollector, in_process_collector

BASE_NS = 1_790_000_000 * 1_000_000_000
LONG_AGENT = "agent-".ljust(128, "l")  # its keys use agent=h-<sha256> (PROTOCOL §3)


@pytest.fixture
async def collector() -> AsyncIterator[InProcessCollector]:
    async with in_process_collector() as running:
        yield running


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as opened:
        yield opened


def conflict_record(agent: str, seq: int, observed_ns: int) -> records.IdentityConflict:
    identity = keys.BatchIdentity(agent, BOOT, seq, seq)
    accepted = hashlib.sha256(f"accepted {agent} {seq}".encode()).hexdigest()
    submitted = hashlib.sha256(f"submitted {agent} {seq}".encode()).hexdigest()
    return records.IdentityConflict(
        agent_id=agent,
        boot_id=str(BOOT),
        seq_start=seq,
        seq_end=seq,
        accepted_manifest_key=keys.accepted_manifest_key(identity),
        accepted_raw_blob_key=keys.raw_blob_key(accepted),
        accepted_frame_sha256=accepted,
        submitted_raw_blob_key=keys.raw_blob_key(submitted),
        submitted_frame_sha256=submitted,
        observed_at_unix_ns=observed_ns,
        collector_id="elsewhere",
    )


async def put_conflict(
    store: MemoryStore | FileSystemStore, conflict: records.IdentityConflict, key: str = ""
) -> str:
    key = key or conflict.quarantine_key
    await store.put(key, conflict.to_json(), if_none_match=True)
    return key


def observed_ns(i: int) -> int:
    """Observation times that do not follow key order (7 is prime to 25)."""
    return BASE_NS + (i * 7) % 25


async def store_25(memory: MemoryStore) -> dict[str, int]:
    """25 records of 3 agents: their keys → observed_at."""
    stored = {}
    for i in range(25):
        conflict = conflict_record(f"agent-page-{i % 3}", i, observed_ns(i))
        stored[await put_conflict(memory, conflict)] = conflict.observed_at_unix_ns
    return stored


def count_quarantine_gets(
    collector: InProcessCollector, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """The quarantine keys the app GETs, in order (the memory store under the app's)."""
    read: list[str] = []
    inner = collector.memory.get

    async def counted(key: str) -> tuple[bytes, str]:
        if key.startswith(keys.QUARANTINE_PREFIX):
            read.append(key)
        return await inner(key)

    monkeypatch.setattr(collector.memory, "get", counted)
    return read


async def conflicts(
    session: aiohttp.ClientSession, collector: InProcessCollector, **params: str
) -> Answer:
    return await get(
        session, f"{collector.base_url}/v1/conflicts", token=ADMIN_TOKEN, params=params
    )


async def walk(
    session: aiohttp.ClientSession,
    collector: InProcessCollector,
    read: list[str],
    *,
    limit: int,
    **params: str,
) -> list[dict[str, Any]]:
    """Every page by ``next``, checking each reads at most ``limit`` records."""
    pages: list[dict[str, Any]] = []
    after: dict[str, str] = {}
    while True:
        before = len(read)
        answer = await conflicts(session, collector, limit=str(limit), **params, **after)
        assert answer.status == 200, answer
        assert len(read) - before <= limit, (len(read) - before, answer.json)
        pages.append(answer.json)
        assert answer.json["truncated"] is (answer.json["next"] is not None)
        if answer.json["next"] is None:
            return pages
        assert answer.json["next"] == read[-1]  # the last key read
        after = {"after": answer.json["next"]}
        assert len(pages) < 100, "the walk does not end"


async def test_a_page_reads_at_most_limit_records_and_next_walks_them_all_once(
    collector: InProcessCollector,
    session: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stored = await store_25(collector.memory)
    read = count_quarantine_gets(collector, monkeypatch)

    first = await conflicts(session, collector, limit="10")

    assert first.status == 200, first
    assert len(read) == 10
    assert [c["quarantine_key"] for c in first.json["conflicts"]] == sorted(stored)[:10]
    assert first.json["next"] == sorted(stored)[9]
    assert first.json["truncated"] is True

    read.clear()
    pages = await walk(session, collector, read, limit=10)

    assert [len(page["conflicts"]) for page in pages] == [10, 10, 5]
    assert read == sorted(stored)  # each record read exactly once, in key order
    listed = [c["quarantine_key"] for page in pages for c in page["conflicts"]]
    assert listed == sorted(stored)
    assert pages[-1] == {"conflicts": pages[-1]["conflicts"], "next": None, "truncated": False}


async def test_a_listing_of_exactly_limit_records_has_no_next_page(
    collector: InProcessCollector, session: aiohttp.ClientSession
) -> None:
    stored = await store_25(collector.memory)

    answer = await conflicts(session, collector, limit="25")

    assert answer.status == 200, answer
    assert len(answer.json["conflicts"]) == len(stored)
    assert (answer.json["next"], answer.json["truncated"]) == (None, False)
    assert (await conflicts(session, collector)).json["next"] is None  # default limit 1000


async def test_since_filters_across_pages_and_what_it_leaves_out_is_still_read(
    collector: InProcessCollector,
    session: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stored = await store_25(collector.memory)
    read = count_quarantine_gets(collector, monkeypatch)
    since = BASE_NS + 20  # 5 of the 25 records, spread over the key order

    pages = await walk(session, collector, read, limit=10, since=str(since))

    assert len(pages) == 3
    assert read == sorted(stored)
    listed = [c["quarantine_key"] for page in pages for c in page["conflicts"]]
    assert listed == sorted(key for key, at in stored.items() if at >= since)
    assert len(listed) == 5
    assert all(len(page["conflicts"]) < 10 for page in pages)  # short pages still go on
    assert all(c["observed_at_unix_ns"] >= since for page in pages for c in page["conflicts"])


async def test_agent_id_pages_through_both_key_forms(
    collector: InProcessCollector,
    session: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long agent's records may lie under ``agent=h-...`` and, written before the
    segment rule, under the hex form: ``next`` goes from one prefix to the other."""
    current = [
        await put_conflict(collector.memory, conflict_record(LONG_AGENT, seq, BASE_NS))
        for seq in (1, 2)
    ]
    legacy = []
    for seq in (3, 4, 5):
        conflict = conflict_record(LONG_AGENT, seq, BASE_NS)
        legacy_key = keys.legacy_quarantine_key(conflict.identity, conflict.submitted_frame_sha256)
        assert legacy_key is not None
        legacy.append(await put_conflict(collector.memory, conflict, legacy_key))
    await store_25(collector.memory)  # other agents' records, never read
    read = count_quarantine_gets(collector, monkeypatch)

    pages = await walk(session, collector, read, limit=2, agent_id=LONG_AGENT)

    assert read == current + legacy
    assert [[c["quarantine_key"] for c in page["conflicts"]] for page in pages] == [
        current,
        legacy[:2],
        legacy[2:],
    ]


async def test_a_key_that_is_not_a_quarantine_key_is_skipped_unread_and_a_bad_record_counts(
    collector: InProcessCollector,
    session: aiohttp.ClientSession,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = [
        await put_conflict(collector.memory, conflict_record("agent-odd", seq, BASE_NS))
        for seq in (1, 2)
    ]
    unreadable = keys.quarantine_key(keys.BatchIdentity("agent-odd", BOOT, 3, 3), "0" * 64)
    await collector.memory.put(unreadable, b"{not json")
    stray = f"{keys.QUARANTINE_PREFIX}agent=6167/stray.json"
    await collector.memory.put(stray, b"{}")
    read = count_quarantine_gets(collector, monkeypatch)

    pages = await walk(session, collector, read, limit=1)

    assert sorted(read) == sorted([*good, unreadable])  # the stray key never read
    assert [len(page["conflicts"]) for page in pages] == [1, 1, 0]
    assert pages[-1]["next"] is None


@pytest.mark.parametrize(
    "after",
    [
        "nonsense",
        "",
        keys.QUARANTINE_PREFIX,
        keys.raw_blob_key("a" * 64),
        f"{keys.QUARANTINE_PREFIX}agent=6167/stray.json",
        conflict_record("agent-x", 1, BASE_NS).quarantine_key.replace(".json", ".jso"),
        conflict_record("agent-x", 1, BASE_NS).quarantine_key + "/x",
        "accepted/v1/../" + conflict_record("agent-x", 1, BASE_NS).quarantine_key,
        conflict_record("agent-x", 1, BASE_NS).quarantine_key.replace("agent=", "agent=zz"),
        "\ufffd",
    ],
)
async def test_an_after_that_is_not_a_quarantine_key_is_400_naming_it(
    collector: InProcessCollector, session: aiohttp.ClientSession, after: str
) -> None:
    answer = await conflicts(session, collector, after=after)

    assert answer.status == 400, answer
    assert (answer.json["error"], answer.json["param"]) == ("invalid_query", "after")
    assert answer.json["detail"]


async def test_an_after_of_another_agent_is_400_when_agent_id_is_given(
    collector: InProcessCollector, session: aiohttp.ClientSession
) -> None:
    stored = sorted(await store_25(collector.memory))
    other = next(key for key in stored if "agent=" + b"agent-page-1".hex() in key)
    mine = next(key for key in stored if "agent=" + b"agent-page-0".hex() in key)

    refused = await conflicts(session, collector, agent_id="agent-page-0", after=other)
    accepted = await conflicts(session, collector, agent_id="agent-page-0", after=mine)
    unfiltered = await conflicts(session, collector, after=other)

    assert refused.status == 400, refused
    assert (refused.json["error"], refused.json["param"]) == ("invalid_query", "after")
    assert accepted.status == 200, accepted
    assert mine not in [c["quarantine_key"] for c in accepted.json["conflicts"]]
    assert {c["agent_id"] for c in accepted.json["conflicts"]} == {"agent-page-0"}
    assert unfiltered.status == 200, unfiltered
    assert [c["quarantine_key"] for c in unfiltered.json["conflicts"]] == [
        key for key in stored if key > other
    ]


async def test_an_after_given_twice_is_400(
    collector: InProcessCollector, session: aiohttp.ClientSession
) -> None:
    key = conflict_record("agent-x", 1, BASE_NS).quarantine_key
    async with session.get(
        f"{collector.base_url}/v1/conflicts",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        params=[("after", key), ("after", key)],
    ) as response:
        assert response.status == 400
        assert (await response.json())["param"] == "after"


def test_the_cli_follows_next_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = FileSystemStore(tmp_path / "store")

    async def fill() -> list[str]:
        try:
            return [
                await put_conflict(store, conflict_record("agent-cli", seq, BASE_NS))
                for seq in range(7)
            ]
        finally:
            await store.close()

    stored = sorted(asyncio.run(fill()))
    monkeypatch.setenv("LM_STORE__URL", f"file://{tmp_path / 'store'}")
    pages: list[int] = []
    read_page = collector_cli.read_conflicts_page

    async def counted(*args: Any, **kwargs: Any) -> Any:
        page = await read_page(*args, **kwargs)
        pages.append(len(page.conflicts))
        return page

    monkeypatch.setattr(collector_cli, "read_conflicts_page", counted)
    monkeypatch.setattr(collector_cli, "DEFAULT_CONFLICTS_LIMIT", 3)

    assert collector_cli.main(["conflicts"]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["quarantine_key"] for line in out.splitlines()] == stored
    assert pages == [3, 3, 1]
    assert "7 identity conflict(s)" in err and "more" not in err

    pages.clear()
    assert collector_cli.main(["conflicts", "--limit", "5"]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["quarantine_key"] for line in out.splitlines()] == stored[:5]
    assert pages == [3, 2]
    assert "... more" in err and "5 identity conflict(s)" in err


async def test_a_page_is_read_concurrently_bounded_and_answered_in_key_order(
    collector: InProcessCollector, session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`READ_CONCURRENCY` GETs at once; the later keys answer first, the page keeps key
    order."""
    stored = await store_25(collector.memory)
    inner, flying, most = collector.memory.get, [0], [0]

    async def slow(key: str) -> tuple[bytes, str]:
        flying[0] += 1
        most[0] = max(most[0], flying[0])
        try:
            # Earlier keys wait longer (a yield per later key), so answers finish reversed.
            for _ in range(sum(1 for other in stored if other > key) + 1):
                await asyncio.sleep(0)
            return await inner(key)
        finally:
            flying[0] -= 1

    monkeypatch.setattr(collector.memory, "get", slow)
    answer = await conflicts(session, collector, limit="25")
    assert answer.status == 200, answer
    assert [c["quarantine_key"] for c in answer.json["conflicts"]] == sorted(stored)
    assert most[0] == conflicts_api.READ_CONCURRENCY


async def test_a_failed_get_is_503_and_no_page(
    collector: InProcessCollector, session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    stored = sorted(await store_25(collector.memory))
    inner = collector.memory.get

    async def failing(key: str) -> tuple[bytes, str]:
        if key == stored[7]:
            raise Unavailable("get", key, "the store is down")
        return await inner(key)

    monkeypatch.setattr(collector.memory, "get", failing)
    answer = await conflicts(session, collector, limit="25")
    assert answer.status == 503 and answer.json["error"] == "store_unavailable", answer
    assert answer.headers["Retry-After"]
