"""Our side of the differential test (issue 32): real ``lm-collector serve`` processes with
the supervised Prometheus engine (``[query.promql] prometheus``) over one filesystem
store, fed the fleet (`feed`), cataloged as the reconciler does and rolled up by the real
Spark job on a local session, in the stages the three checks need:

1. ``live``: every batch accepted by the designated collector D and held in its live
   window, none rolled up (check b). The batches of the first hour (and the frame batch
   that straddles 11:00) were cataloged before the second hour was sent.
2. ``split``: one rollup run: the cataloged first hour is committed (snapshot 1), the
   second hour is live in D's window, and the first hour's batches are in the ledger
   *and* still in the window (check c: nothing twice).
3. ``committed``: the rest cataloged and rolled up (snapshot 2), answered by collector C
   which keeps no window at all (check a: committed data only).

Every wait polls with a bounded, jittered deadline; processes are stopped by PID.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from config import hash_token
from protocol import keys
from protocol.records import AcceptedManifest
from store.fs import FileSystemStore
from tests.collector.conftest import CollectorLauncher, CollectorProcess
from tests.collector.promql.diff import extras
from tests.collector.promql.diff.feed import Batch, batches, send
from tests.collector.promql.diff.fleet import END_MS, STALE_NAN_BITS, T0_MS, fleet
from tests.collector.promql.diff.runner import Target, ask

if False:  # pragma: no cover - typing only, pyspark is imported lazily
    from pyspark.sql import SparkSession

READ, WRITE = "diff-read-token", "diff-write-token"
STAGES = ("new", "live", "split", "committed")
WAIT_S = 90.0
COUNT_QUERY = '{__name__=~".+"}[3h]'  # every raw sample (count_over_time drops names)
COUNT_AT = f"{(END_MS + 5 * 60_000) / 1000:.3f}"


def expected_count() -> int:
    """Samples `COUNT_QUERY` returns: every sample of the fleet but the stale markers."""
    return sum(int((s.values.view(np.uint64) != STALE_NAN_BITS).sum()) for s in fleet().series)


def tokens_file(path: Path) -> Path:
    path.write_text(
        "[[principal]]\n"
        f'name = "writer"\ntoken_sha256 = "{hash_token(WRITE)}"\nagents = ["agent-*"]\n\n'
        "[[principal]]\n"
        f'name = "dashboards"\ntoken_sha256 = "{hash_token(READ)}"\nagents = []\nread = true\n'
    )
    return path


async def wait_until(what: str, check: Any, timeout_s: float = WAIT_S) -> Any:
    """Poll ``check()`` (async; a truthy result that is not a string ends the wait, a
    string says what is still missing) with a bounded, jittered backoff; fail naming
    ``what`` and the last result."""
    deadline = time.monotonic() + timeout_s
    delay, last = 0.1, None
    while time.monotonic() < deadline:
        last = await check()
        if last is True or (last and not isinstance(last, str)):
            return last
        await asyncio.sleep(delay * random.uniform(0.5, 1.5))
        delay = min(delay * 1.5, 1.0)
    raise AssertionError(f"{what}: not within {timeout_s}s; last {last!r}")


@dataclass
class Ours:
    """The collectors, the store and the Spark session; `advance` moves through STAGES."""

    work_dir: Path
    binary: str
    spark: SparkSession
    stage: str = "new"
    launcher: CollectorLauncher = field(init=False)
    store_path: Path = field(init=False)
    designated: CollectorProcess | None = None
    committed_only: CollectorProcess | None = None
    cataloged: set[str] = field(default_factory=set)
    epoch: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    sent: list[list[Batch]] = field(default_factory=list)  # the batches of each phase
    rolled_up: list[tuple[int, int]] = field(default_factory=list)  # (batches, points) a run

    def __post_init__(self) -> None:
        self.launcher = CollectorLauncher(self.work_dir / "collectors")
        self.store_path = self.work_dir / "store"
        self.tokens = tokens_file(self.work_dir / "tokens.toml")

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "LM_AUTH__TOKENS_FILE": str(self.tokens),
            "LM_QUERY__PROMQL__PROMETHEUS": self.binary,
            "LM_QUERY__REFRESH_INTERVAL_S": "0.2",
            "LM_INGEST__INDEX_FLUSH_MAX_AGE_MS": "200",
            **extra,
        }

    def target(self, process: CollectorProcess) -> Target:
        return Target(process.base_url, {"Authorization": f"Bearer {READ}"})

    def stop(self) -> None:
        self.launcher.stop_all()

    async def advance(self, stage: str) -> None:
        while STAGES.index(self.stage) < STAGES.index(stage):
            step = STAGES[STAGES.index(self.stage) + 1]
            started = time.monotonic()
            await getattr(self, f"_to_{step}")()
            self.timings[step] = time.monotonic() - started
            self.stage = step

    async def _to_live(self) -> None:
        url = f"file://{self.store_path}"
        self.designated = self.launcher.start(
            store_url=url,
            name="designated",
            env=self.env(LM_QUERY__DESIGNATED="true", LM_QUERY__POLL_INTERVAL_S="0.3"),
        )
        all_batches = batches(fleet())
        hour_two = T0_MS + 3600 * 1000
        first = [b for b in all_batches if b.first_ms < hour_two] + extras.batches(extras.BATCH_A)
        second = [b for b in all_batches if b.first_ms >= hour_two] + extras.batches(extras.BATCH_B)
        self.sent = [first, second]
        async with aiohttp.ClientSession() as session:
            await self._send(session, first)
            await self._catalog()  # the first hour only: what the first rollup includes
            await self._send(session, second)
        await self.wait_for_all(self.designated)

    async def _send(self, session: aiohttp.ClientSession, chosen: list[Batch]) -> None:
        assert self.designated is not None
        for batch in chosen:
            await send(session, self.designated.base_url, batch, WRITE)

    async def _to_split(self) -> None:
        await self._rollup()
        assert self.designated is not None
        await self.wait_for_snapshot(self.designated, 1)
        await self.wait_for_all(self.designated)

    async def _to_committed(self) -> None:
        await self._catalog()
        await self._rollup()
        self.committed_only = self.launcher.start(
            store_url=f"file://{self.store_path}", name="committed-only", env=self.env()
        )
        await self.wait_for_snapshot(self.committed_only, 2)
        await self.wait_for_all(self.committed_only)

    async def _catalog(self) -> None:
        """Catalog every accepted manifest not cataloged yet, with its work marker, as the
        reconciler's steady pass does (`tests.rollup.dataset_builder.catalog_manifests`)."""
        from tests.rollup.dataset_builder import catalog_manifests

        store = FileSystemStore(self.store_path)
        manifests = []
        async for info in store.list(keys.ACCEPTED_PREFIX):
            if info.key not in self.cataloged:
                body, _ = await store.get(info.key)
                manifests.append(AcceptedManifest.from_json(body))
                self.cataloged.add(info.key)
        assert manifests, "nothing accepted to catalog"
        self.epoch += 1
        await catalog_manifests(store, manifests, epoch=self.epoch)

    async def _rollup(self) -> None:
        from rollup.job.run import run_rollup
        from rollup.table.storage import StoreAccess
        from tests.rollup.conftest import settings

        store = FileSystemStore(self.store_path)
        summary = await run_rollup(
            self.spark, store, access=StoreAccess(store.url), settings=settings()
        )
        assert summary.outcome == "committed", summary
        self.rolled_up.append((summary.batches, summary.points))

    async def wait_for_all(self, process: CollectorProcess) -> None:
        """Until ``process`` answers the fleet's sample count through PromQL."""
        want = expected_count()
        target = self.target(process)
        async with aiohttp.ClientSession() as session:

            async def counted() -> int | str:
                params = {"query": COUNT_QUERY, "time": COUNT_AT}
                answer = await ask(session, target, "/api/v1/query", params)
                if answer["status"] != "success":
                    return f"{answer.get('errorType')}: {answer.get('error')}"
                got = sum(len(series["values"]) for series in answer["data"]["result"])
                return got if got == want else f"{got} samples"

            await wait_until(f"{process.name} counts {want} samples", counted)

    async def extras_problems(self, process: CollectorProcess) -> list[str]:
        """How ``process``'s answers to `extras.EXPECTED` differ from it."""
        found = []
        async with aiohttp.ClientSession() as session:
            for expr in extras.EXPECTED:
                params = {"query": expr, "time": extras.AT_S}
                answer = await ask(session, self.target(process), "/api/v1/query", params)
                found += extras.problems(expr, answer)
        return found

    async def wait_for_snapshot(self, process: CollectorProcess, version: int) -> None:
        params = {
            "metric": "cpu_usage_ratio",
            "from": str(T0_MS // 1000),
            "to": str(END_MS // 1000 + 60),
        }
        headers = {"Authorization": f"Bearer {READ}"}
        async with aiohttp.ClientSession() as session:

            async def seen() -> bool:
                async with session.get(
                    f"{process.base_url}/v1/query", params=params, headers=headers
                ) as answer:
                    body = json.loads(await answer.text())
                return answer.status == 200 and body.get("snapshot_version") == version

            await wait_until(f"{process.name} reads snapshot {version}", seen)
