"""Real ``lm-collector`` processes: start-up refusals, graceful stop, races between
collectors over one store (filesystem and MiniStack), ``--workers``, an S3 outage, and a
``kill -9`` under load.

The invariants checked after every race or crash are the acceptance protocol's:
exactly one accepted manifest per identity, every 200 for an identity names the same
``frame_sha256`` (the one in the manifest), exactly one ``duplicate: false`` per identity
across all collectors, no 5xx, and no 200 without its manifest and raw blob in the store.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

from chaos.faulty_store import Fault, FaultyStore
from collector.probe import ProbeFailed, probe_conditional_writes
from protocol import keys, records
from protocol.clock import ManualClock, SystemClock
from store.base import ObjectStore
from store.errors import ConditionConflict
from store.fs import FileSystemStore
from store.memory import MemoryStore
from store.open import open_store
from tests.collector.conftest import (
    Answer,
    CollectorLauncher,
    CollectorProcess,
    free_port,
    get,
    logged_keys,
    make_frame,
    manifest_key_of,
    metric_value,
    post_frame,
    run_cli,
    store_keys,
)
from tests.s3_servers import RunningServer, fresh_bucket, start_ministack

# --- helpers ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """One identity and the frame sent for it."""

    agent_id: str
    seq_start: int
    frame: bytes

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.frame).hexdigest()

    @property
    def manifest_key(self) -> str:
        return manifest_key_of(self.agent_id, self.seq_start)


def make_batches(count: int, *, agents: int = 20, prefix: str = "agent") -> list[Batch]:
    batches = []
    for i in range(count):
        agent_id, seq_start = f"{prefix}-{i % agents:02d}", (i // agents) * 3
        batches.append(Batch(agent_id, seq_start, make_frame(agent_id, seq_start=seq_start)))
    return batches


@dataclass
class Outcomes:
    """Every answer (or client-side failure) per batch index, and the final answer of
    each POST (after its retries)."""

    answers: dict[int, list[Answer]] = field(default_factory=dict)
    finals: dict[int, list[Answer]] = field(default_factory=dict)
    failures: dict[int, list[str]] = field(default_factory=dict)

    def add(self, index: int, answer: Answer) -> None:
        self.answers.setdefault(index, []).append(answer)

    def settle(self, index: int, answer: Answer) -> None:
        self.finals.setdefault(index, []).append(answer)

    def fail(self, index: int, error: BaseException) -> None:
        self.failures.setdefault(index, []).append(repr(error))

    def statuses(self) -> list[int]:
        return [a.status for answers in self.answers.values() for a in answers]

    def unsettled(self, index: int) -> bool:
        """Whether some POST of this batch was answered 503 (its outcome unknown)."""
        return any(a.status == 503 for a in self.answers.get(index, []))


RETRY_ATTEMPTS = 12
RESEND = {"X-Lightmetrics-Resend": "1"}


async def post_batch(
    session: aiohttp.ClientSession,
    url: str,
    batch: Batch,
    outcomes: Outcomes,
    index: int,
    *,
    retry_503: bool = True,
) -> Answer | None:
    """POST ``batch`` as the agent contract says: a 503 is retried with jittered backoff
    (bounded), each re-send carrying ``X-Lightmetrics-Resend: 1`` like the reference
    agent. A 503 is a legitimate answer whenever the store does not settle within the
    request budget, which a loaded machine makes happen; repeating is safe because the
    answer depends only on the frame's bytes and what is already accepted. A network
    error ends the POST (recorded as a failure)."""
    rng = random.Random(f"{url} {index}")
    for attempt in range(RETRY_ATTEMPTS if retry_503 else 1):
        headers = RESEND if attempt else None
        try:
            answer = await post_frame(session, url, batch.frame, headers=headers)
        except (aiohttp.ClientError, ConnectionError) as exc:
            outcomes.fail(index, exc)
            return None
        outcomes.add(index, answer)
        if answer.status != 503:
            break
        await asyncio.sleep(rng.uniform(0, min(2.0, 0.05 * 2**attempt)))  # jittered backoff
    outcomes.settle(index, answer)
    return answer


@asynccontextmanager
async def opened(store: ObjectStore) -> AsyncIterator[ObjectStore]:
    try:
        yield store
    finally:
        await store.close()


async def assert_one_acceptance_per_identity(
    store: ObjectStore, batches: Sequence[Batch], outcomes: Outcomes
) -> None:
    """The race invariants over the answers and the whole store: every POST ends in a 200
    (after 503s only), every 200 names the one accepted frame, at most one 200 says
    "new" (exactly one unless a 503 left whose attempt created the manifest unknown), and
    the manifest and raw blob of every batch are in the store."""
    statuses = outcomes.statuses()
    assert set(statuses) <= {200, 503}, sorted(set(statuses))
    assert not outcomes.failures, list(outcomes.failures.items())[:5]
    for index, batch in enumerate(batches):
        assert {a.status for a in outcomes.finals[index]} == {200}, outcomes.finals[index]
        answers = [a for a in outcomes.answers[index] if a.status == 200]
        assert {a.json["frame_sha256"] for a in answers} == {batch.sha}, answers
        assert {a.json["manifest_key"] for a in answers} == {batch.manifest_key}
        new = [a for a in answers if a.json["duplicate"] is False]
        assert len(new) == 1 or (not new and outcomes.unsettled(index)), (
            f"{batch.manifest_key}: {len(new)} new acceptances: {answers}"
        )
    manifests = await store_keys(store, keys.ACCEPTED_PREFIX)
    assert sorted(manifests) == sorted(b.manifest_key for b in batches)
    blobs = set(await store_keys(store, keys.RAW_BLOBS_PREFIX))
    for index, batch in enumerate(batches):
        manifest = records.AcceptedManifest.from_json((await store.get(batch.manifest_key))[0])
        assert manifest.frame_sha256 == batch.sha
        # The answer saying "new" came from the collector that created the manifest.
        for answer in outcomes.answers[index]:
            if answer.status == 200 and answer.json["duplicate"] is False:
                assert answer.json["collector_id"] == manifest.collector_id
        assert keys.raw_blob_key(batch.sha) in blobs


# --- start-up -----------------------------------------------------------------------------


async def test_probe_refuses_a_store_that_ignores_conditions() -> None:
    store = FaultyStore(MemoryStore(), ignore_conditions=True)

    with pytest.raises(ProbeFailed) as refused:
        await probe_conditional_writes(store, collector_id="c-1", clock=SystemClock())

    assert "ignores conditional writes" in str(refused.value)
    assert "cannot be an acceptance authority" in str(refused.value)
    assert await store_keys(store) == []  # the probe cleans up after itself


async def test_probe_waits_out_conflicts_and_lost_answers() -> None:
    """A collector restarted while the store answers 409s and loses answers (the chaos run's
    kill rounds) retries the probe with fresh keys instead of exiting; still bounded."""
    store = FaultyStore(MemoryStore())
    store.script("put_if_none_match", keys.PROBE_PREFIX, Fault.CONFLICT, Fault.LOST_REPLY)
    store.script("put_if_none_match", f"{keys.PROBE_PREFIX}c-1-etag-", Fault.CONFLICT)
    clock = ManualClock()  # the backoff sleeps in virtual time
    result = await probe_conditional_writes(store, collector_id="c-1", clock=clock)
    assert result.ok

    always = FaultyStore(MemoryStore())
    always.script("put_if_none_match", keys.PROBE_PREFIX, *([Fault.CONFLICT] * 50))
    with pytest.raises(ConditionConflict):
        await probe_conditional_writes(always, collector_id="c-1", clock=clock)


async def test_probe_passes_on_a_store_that_enforces_conditions() -> None:
    result = await probe_conditional_writes(MemoryStore(), collector_id="c-1", clock=SystemClock())
    assert result.ok


def test_serve_refuses_a_non_loopback_host_without_tokens(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    done = run_cli(
        ["serve"],
        {"LM_HTTP__HOST": "0.0.0.0", "LM_HTTP__PORT": "0", "LM_STORE__URL": f"file://{store_dir}"},
        tmp_path,
    )

    assert done.returncode == 2, done
    assert "http.host" in done.stderr and "auth.tokens_file" in done.stderr, done.stderr
    assert "refusing to start" in done.stderr
    assert not store_dir.exists()  # refused before touching the store (or binding)


def test_probe_command_passes_on_a_filesystem_store(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    done = run_cli(["probe"], {"LM_STORE__URL": f"file://{store_dir}"}, tmp_path)

    assert done.returncode == 0, done
    assert "probe passed" in done.stdout
    assert f"file://{store_dir}" in done.stdout


BAD_CONFIG = {
    "port_out_of_range": ({"LM_HTTP__PORT": "70000"}, None, "http.port"),
    "not_an_integer": ({"LM_INGEST__MAX_FRAME_BYTES": "lots"}, None, "ingest.max_frame_bytes"),
    "misspelt_variable": ({"LM_HTTP__PROT": "8080"}, None, "LM_HTTP__PROT"),
    "bad_store_url": ({"LM_STORE__URL": "ftp://somewhere"}, None, "store.url"),
    "unknown_key_in_file": ({}, "[http]\nhots = '127.0.0.1'\n", "http.hots"),
    "bad_value_in_file": ({}, "[ingest]\nrequest_budget_s = -1\n", "ingest.request_budget_s"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIG))
def test_bad_configuration_exits_2_naming_the_key(case: str, tmp_path: Path) -> None:
    env, toml, key = BAD_CONFIG[case]
    args = ["serve"]
    if toml is not None:
        (tmp_path / "collector.toml").write_text(toml)
        args = ["--config", str(tmp_path / "collector.toml"), "serve"]

    done = run_cli(args, {"LM_HTTP__PORT": "0", **env}, tmp_path)

    assert done.returncode == 2, done
    assert "configuration error" in done.stderr
    assert key in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "content", [None, "[[principal]]\nname = 'x'\n"], ids=["missing", "invalid"]
)
def test_bad_tokens_file_exits_2_naming_it(content: str | None, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    if content is not None:
        tokens.write_text(content)

    done = run_cli(
        ["serve"],
        {
            "LM_HTTP__PORT": "0",
            "LM_STORE__URL": f"file://{tmp_path / 'store'}",
            "LM_AUTH__TOKENS_FILE": str(tokens),
        },
        tmp_path,
        timeout_s=30,
    )

    assert done.returncode == 2, done
    assert str(tokens) in done.stderr
    assert "Traceback" not in done.stderr


def test_probe_on_start_false_skips_the_probe(
    collectors: CollectorLauncher, tmp_path: Path
) -> None:
    collector = collectors.start(
        store_url=f"file://{tmp_path / 'store'}", env={"LM_INGEST__PROBE_ON_START": "false"}
    )
    events = [e.get("event") for e in collector.events()]
    assert "probe_skipped" in events and "probe_passed" not in events


# --- graceful stop ------------------------------------------------------------------------


async def wait_for_in_flight(session: aiohttp.ClientSession, base_url: str, count: int) -> None:
    deadline = time.monotonic() + 20
    while True:
        text = (await get(session, f"{base_url}/metrics")).text
        if metric_value(text, "lm_collector_in_flight_requests") == count:
            return
        assert time.monotonic() < deadline, f"never {count} request(s) in flight"
        await asyncio.sleep(0.02)  # polling with a deadline


async def wait_for_event(collector: CollectorProcess, name: str) -> None:
    deadline = time.monotonic() + 20
    while not any(e.get("event") == name for e in collector.events()):
        assert time.monotonic() < deadline, f"no {name!r} event; log:\n{collector.log_tail()}"
        await asyncio.sleep(0.02)  # polling the log with a deadline


def assert_logged(logged: set[str], batches: Sequence[Batch]) -> None:
    """Each batch's accepted row and its blob's row are in the index log."""
    for batch in batches:
        assert batch.manifest_key in logged, f"no accepted row for {batch}"
        assert keys.raw_blob_key(batch.sha) in logged, f"no blob row for {batch}"


async def test_sigterm_exits_0_with_every_buffered_index_row_written(
    collectors: CollectorLauncher, tmp_path: Path
) -> None:
    store_dir = tmp_path / "store"
    collector = collectors.start(store_url=f"file://{store_dir}")
    batches = make_batches(100, prefix="agent-stop")

    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(
            *(post_frame(session, collector.base_url, b.frame) for b in batches)
        )
    collector.terminate()  # right after the last answer: index rows may be buffered
    assert [a.status for a in answers] == [200] * len(batches)

    assert await asyncio.to_thread(collector.wait) == 0
    async with opened(FileSystemStore(store_dir)) as store:
        assert_logged(await logged_keys(store), batches)  # no waiting
    (stopped,) = [e for e in collector.events() if e.get("event") == "collector_stopped"]
    assert stopped["index_rows_dropped"] == 0
    assert stopped["index_rows_written"] == 2 * len(batches)  # a blob and an accepted row


async def test_sigterm_answers_the_upload_still_in_flight(
    collectors: CollectorLauncher, tmp_path: Path
) -> None:
    store_dir = tmp_path / "store"
    collector = collectors.start(
        store_url=f"file://{store_dir}", env={"LM_HTTP__SHUTDOWN_GRACE_S": "3"}
    )
    slow = make_batches(1, prefix="agent-slow")[0]
    release = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        yield slow.frame[:20]
        await asyncio.wait_for(release.wait(), timeout=60)
        yield slow.frame[20:]

    async with aiohttp.ClientSession() as session, aiohttp.ClientSession() as slow_session:
        upload = asyncio.create_task(post_frame(slow_session, collector.base_url, slow_body()))
        try:
            await wait_for_in_flight(session, collector.base_url, 1)
            collector.terminate()
            await wait_for_event(collector, "collector_stopping")
            # Intake has stopped: a new connection is refused.
            deadline = time.monotonic() + 20
            while True:
                try:
                    async with aiohttp.ClientSession() as fresh:
                        await get(fresh, f"{collector.base_url}/healthz")
                except aiohttp.ClientConnectorError:
                    break
                assert time.monotonic() < deadline, "still accepting connections after SIGTERM"
                await asyncio.sleep(0.02)
        finally:
            release.set()
            answer = await upload

    assert answer.status == 200 and answer.json["duplicate"] is False, answer
    assert await asyncio.to_thread(collector.wait) == 0
    async with opened(FileSystemStore(store_dir)) as store:
        assert_logged(await logged_keys(store), [slow])  # right after exit


# --- races between collector processes over one store -------------------------------------


async def race(
    urls: Sequence[str], batches: Sequence[Batch], *, resends: int, seed: int
) -> Outcomes:
    """POST every batch to every collector at once; ``resends`` batches get a third POST
    to a random collector in the same burst. Bounded concurrency across batches."""
    rng = random.Random(seed)
    resent = set(rng.sample(range(len(batches)), resends))
    outcomes = Outcomes()
    slots = asyncio.Semaphore(24)

    async def one(session: aiohttp.ClientSession, index: int) -> None:
        targets = list(urls) + ([rng.choice(urls)] if index in resent else [])
        async with slots:
            await asyncio.gather(
                *(post_batch(session, url, batches[index], outcomes, index) for url in targets)
            )

    connector = aiohttp.TCPConnector(limit=96)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(one(session, i) for i in range(len(batches))))
    return outcomes


@pytest.fixture
def race_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, dict[str, str]]]:
    """(store url, extra collector env) for the store kind named by the parameter."""
    if request.param == "fs":
        yield f"file://{tmp_path / 'store'}", {}
        return
    server: RunningServer = request.getfixturevalue("ministack_server")
    bucket = fresh_bucket(server)
    yield f"s3://{bucket}/race", {"LM_STORE__ENDPOINT_URL": server.endpoint_url}


def open_test_store(url: str, env: Mapping[str, str]) -> ObjectStore:
    return open_store(url, endpoint_url=env.get("LM_STORE__ENDPOINT_URL"), region="us-east-1")


@pytest.mark.parametrize(
    "race_store",
    [pytest.param("fs", id="fs"), pytest.param("ministack", id="ministack", marks=pytest.mark.s3)],
    indirect=True,
)
async def test_two_collectors_racing_500_identities_accept_each_exactly_once(
    race_store: tuple[str, dict[str, str]], collectors: CollectorLauncher
) -> None:
    url, env = race_store
    first = collectors.start(store_url=url, env=env, name="racer-a")
    second = collectors.start(store_url=url, env=env, name="racer-b")
    batches = make_batches(500)

    outcomes = await race([first.base_url, second.base_url], batches, resends=100, seed=5)

    assert sum(len(finals) for finals in outcomes.finals.values()) == 1100
    async with opened(open_test_store(url, env)) as store:
        await assert_one_acceptance_per_identity(store, batches, outcomes)
    new_by = {
        a.json["collector_id"]
        for answers in outcomes.answers.values()
        for a in answers
        if a.json["duplicate"] is False
    }
    assert new_by == {"racer-a", "racer-b"}  # both won some races
    assert first.stop() == 0 and second.stop() == 0


async def test_workers_share_one_port_and_both_serve(
    collectors: CollectorLauncher, tmp_path: Path
) -> None:
    store_dir = tmp_path / "store"
    collector = collectors.start(
        store_url=f"file://{store_dir}", workers=2, port=free_port(), name="pair"
    )
    assert len(set(collector.worker_pids)) == 2
    batches = make_batches(40, prefix="agent-w")
    outcomes = Outcomes()
    workers_seen: set[str] = set()
    # A new connection per request, so the kernel spreads them over both listeners.
    connector = aiohttp.TCPConnector(force_close=True, limit=8)
    async with aiohttp.ClientSession(connector=connector) as session:
        for index, batch in enumerate(batches):
            answer = await post_batch(session, collector.base_url, batch, outcomes, index)
            assert answer is not None and answer.status == 200, answer
            workers_seen.add(answer.headers["X-Lightmetrics-Worker"])

    assert workers_seen == {"0", "1"}
    async with opened(FileSystemStore(store_dir)) as store:
        await assert_one_acceptance_per_identity(store, batches, outcomes)
    assert collector.stop() == 0
    for pid in collector.worker_pids:  # the supervisor reaped its workers
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_request_logs_of_workers_name_the_worker(
    collectors: CollectorLauncher, tmp_path: Path
) -> None:
    collector = collectors.start(
        store_url=f"file://{tmp_path / 'store'}", workers=2, port=free_port(), name="logs"
    )
    async with aiohttp.ClientSession() as session:
        for batch in make_batches(4, prefix="agent-log"):
            assert (await post_frame(session, collector.base_url, batch.frame)).status == 200
    assert collector.stop() == 0
    batch_events = [e for e in collector.events() if e.get("event") == "batch"]
    assert len(batch_events) == 4
    assert all("worker" in event for event in batch_events), batch_events


# --- the S3 server goes away and comes back ------------------------------------------------


@pytest.fixture
def private_ministack(tmp_path: Path) -> Iterator[RunningServer]:
    """A MiniStack of this test's own, since the test stops and restarts it."""
    server = start_ministack(tmp_path / "ministack")
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.s3
async def test_s3_outage_is_503_never_200_and_everything_survives_a_restart(
    private_ministack: RunningServer, collectors: CollectorLauncher
) -> None:
    bucket = fresh_bucket(private_ministack)
    url = f"s3://{bucket}/outage"
    env = {
        "LM_STORE__ENDPOINT_URL": private_ministack.endpoint_url,
        "LM_INGEST__REQUEST_BUDGET_S": "1.5",
        "LM_STORE__CONNECT_TIMEOUT_S": "1",
        "LM_STORE__READ_TIMEOUT_S": "2",
    }
    collector = collectors.start(store_url=url, env=env)
    before = make_batches(20, prefix="agent-before")
    during = make_batches(20, prefix="agent-during")

    async with aiohttp.ClientSession() as session:

        async def post_all(batches: Sequence[Batch], *, retry_503: bool) -> Outcomes:
            outcomes = Outcomes()
            await asyncio.gather(
                *(
                    post_batch(session, collector.base_url, b, outcomes, i, retry_503=retry_503)
                    for i, b in enumerate(batches)
                )
            )
            assert not outcomes.failures, outcomes.failures
            return outcomes

        first = await post_all(before, retry_503=True)
        assert_settled(first, before, duplicates=False)

        private_ministack.stop()
        down = await post_all([*during, *before], retry_503=False)  # one POST each

        assert down.statuses() == [503] * 40, down.statuses()
        for answers in down.answers.values():
            assert answers[0].json == {"error": "store_unavailable"}
            assert int(answers[0].headers["Retry-After"]) >= 1

        private_ministack.start()  # same port, same data directory (S3_PERSIST=1)
        after = await post_all([*during, *before], retry_503=True)

    assert_settled(after, [*during, *before], duplicates=[False] * 20 + [True] * 20)
    async with opened(open_test_store(url, env)) as store:
        manifests = await store_keys(store, keys.ACCEPTED_PREFIX)
        assert sorted(manifests) == sorted(b.manifest_key for b in [*before, *during])
        for batch in [*before, *during]:
            manifest = records.AcceptedManifest.from_json((await store.get(batch.manifest_key))[0])
            assert manifest.frame_sha256 == batch.sha
            assert (await store.get(keys.raw_blob_key(batch.sha)))[0] == batch.frame


def assert_settled(
    outcomes: Outcomes, batches: Sequence[Batch], *, duplicates: bool | list[bool]
) -> None:
    """Every batch ended in a 200 for its own frame, after 503s only. ``duplicates``: what
    each 200 must say, except that a batch whose earlier POST was answered 503 may be
    answered duplicate (that attempt may have created the manifest)."""
    expected = duplicates if isinstance(duplicates, list) else [duplicates] * len(batches)
    for index, (batch, duplicate) in enumerate(zip(batches, expected, strict=True)):
        answers = outcomes.answers[index]
        assert {a.status for a in answers[:-1]} <= {503}, answers
        final = answers[-1]
        assert final.status == 200, (final.status, final.text)
        assert final.json["frame_sha256"] == batch.sha
        assert final.json["duplicate"] is duplicate or (
            final.json["duplicate"] and outcomes.unsettled(index)
        ), answers


# --- kill -9 under load -------------------------------------------------------------------


async def test_kill_9_under_load_loses_no_acknowledged_batch(
    collectors: CollectorLauncher, tmp_path: Path
) -> None:
    store_dir = tmp_path / "store"
    victim = collectors.start(store_url=f"file://{store_dir}", name="victim")
    batches = make_batches(300, prefix="agent-k")
    outcomes = Outcomes()
    pending = list(range(len(batches)))
    killed_after: list[int] = []

    async def client(session: aiohttp.ClientSession) -> None:
        while pending:
            index = pending.pop(0)
            answer = await post_batch(session, victim.base_url, batches[index], outcomes, index)
            acked = sum(1 for a in outcomes.answers.values() for x in a if x.status == 200)
            if answer is not None and acked >= 100 and not killed_after:
                killed_after.append(acked)
                os.kill(victim.pid, signal.SIGKILL)  # mid-load: other clients are in flight

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as session:
        await asyncio.gather(*(client(session) for _ in range(12)))
    assert killed_after, "the collector was never killed"
    assert await asyncio.to_thread(victim.wait) == -signal.SIGKILL
    assert set(outcomes.statuses()) <= {200, 503}, outcomes.statuses()
    acked = {i for i, answers in outcomes.answers.items() if answers[-1].status == 200}
    assert len(acked) >= 100 and outcomes.failures, "no request went unanswered"

    async with opened(FileSystemStore(store_dir)) as store:
        for index in acked:
            batch = batches[index]
            manifest = records.AcceptedManifest.from_json((await store.get(batch.manifest_key))[0])
            assert manifest.frame_sha256 == batch.sha
            assert (await store.get(keys.raw_blob_key(batch.sha)))[0] == batch.frame

        survivor = collectors.start(store_url=f"file://{store_dir}", name="survivor")
        unacked = [i for i in range(len(batches)) if i not in acked]
        resent = Outcomes()
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(
                *(post_batch(session, survivor.base_url, batches[i], resent, i) for i in unacked)
            )
        assert not resent.failures
        for index in unacked:
            (answer,) = resent.finals[index]
            assert answer.status == 200, answer
            assert answer.json["frame_sha256"] == batches[index].sha

        manifests = await store_keys(store, keys.ACCEPTED_PREFIX)
        assert sorted(manifests) == sorted(b.manifest_key for b in batches)
        for batch in batches:
            manifest = records.AcceptedManifest.from_json((await store.get(batch.manifest_key))[0])
            assert manifest.frame_sha256 == batch.sha
