from __future__ import annotations

import asyncio
import json
import math
import os
import random
import sys
from pathlib import Path

from agent.fleet import RunOptions, SpoolSettings, run_fleet, send_points
from agent.load import LoadSpec
from agent.spool import ParkKind, Spool
from agent.truth import BatchKind
from agent.uploader import UploadPolicy
from protocol.clock import ManualClock
from protocol.frame import decode_frame
from store.retry import Backoff
from tests.agent.conftest import make_points
from tests.agent.fake_collector import CollectorState, FakeCollectors, Reply

REPO = Path(__file__).resolve().parents[2]
OPTIONS = RunOptions(
    policy=UploadPolicy(concurrency=4, backoff=Backoff(attempts=2, base_s=0.01, cap_s=0.02)),
    max_rounds=3,
    round_delay_s=0.5,
)
SPEC = LoadSpec(
    agents=3, batches=6, points_per_batch=20, duplicate_rate=0.3, conflict_rate=0.3, seed=11
)


def held_totals(state: CollectorState) -> tuple[int, int, float]:
    values = [
        v
        for frame in state.accepted.values()
        for v in decode_frame(frame).points.column("value").to_pylist()
    ]
    return len(state.accepted), len(values), math.fsum(values)


async def test_fleet_against_two_collectors_matches_ground_truth(tmp_path: Path):
    state = CollectorState()
    async with FakeCollectors(state, 2) as collectors:
        result = await run_fleet(
            urls=collectors.urls,
            token="t",
            spool=SpoolSettings(tmp_path / "spool"),
            spec=SPEC,
            options=OPTIONS,
            clock=ManualClock(),
            rng=random.Random(3),
        )
    summary, truth = result.summary, result.truth
    assert summary.exit_code == 0, summary.render_table()
    assert summary.accepted == SPEC.total_batches
    assert summary.duplicates == summary.duplicates_injected == len(truth.duplicates_sent) > 0
    assert summary.conflicts == summary.conflicts_injected == len(truth.conflicts_sent) > 0
    assert summary.poison == summary.pending == summary.not_sent == 0
    assert summary.points_accepted == summary.accepted * 20
    assert {seen.server for seen in state.requests} == {0, 1}
    # The ground truth is exactly what the collectors hold.
    totals = truth.totals()
    assert (totals.batches, totals.points, totals.value_sum) == held_totals(state)
    for identity, record in truth.accepted.items():
        assert record.kind is BatchKind.ORIGINAL
        assert state.accepted[identity] == next(
            r.body for r in state.requests if r.sha256 == record.frame_sha256
        )
    with Spool.open(tmp_path / "spool") as spool:
        assert spool.pending() == []
        assert len(spool.parked(ParkKind.CONFLICT)) == summary.conflicts
        assert spool.parked(ParkKind.POISON) == []
    assert json.loads(json.dumps(truth.to_dict()))["accepted_totals"]["batches"] == 18


async def test_outage_leaves_frames_pending_and_next_run_recovers_them(tmp_path: Path):
    spool = SpoolSettings(tmp_path / "spool")
    spec = LoadSpec(agents=2, batches=3, points_per_batch=5, seed=5)
    down = CollectorState([Reply(503, {"error": "store_unavailable"})] * 1000)
    async with FakeCollectors(down) as collectors:
        first = await run_fleet(
            urls=collectors.urls,
            token="t",
            spool=spool,
            spec=spec,
            options=OPTIONS,
            clock=ManualClock(),
        )
    assert first.summary.pending == 6 and first.summary.exit_code == 3
    assert first.summary.retries == 6 * (2 * 3 - 1)  # 2 attempts x 3 rounds per batch
    assert first.truth.accepted == {}

    up = CollectorState()
    async with FakeCollectors(up) as collectors:
        second = await send_points(
            urls=collectors.urls,
            token="t",
            spool=spool,
            agent_id="other",
            tables=[make_points(4)],
            options=OPTIONS,
            clock=ManualClock(),
        )
    assert second.summary.exit_code == 0
    assert second.summary.recovered == 6 and second.summary.accepted == 7
    # Recovered frames went out as the same bytes, under the first run's identities.
    first_shas = {r.frame_sha256 for r in first.truth.sent}
    assert first_shas <= {seen.sha256 for seen in up.requests}
    assert set(first.truth.originals) <= set(up.accepted)


async def test_small_spool_applies_backpressure_and_still_delivers(tmp_path: Path):
    state = CollectorState()
    async with FakeCollectors(state) as collectors:
        result = await run_fleet(
            urls=collectors.urls,
            token="t",
            spool=SpoolSettings(tmp_path / "spool", max_pending_frames=2),
            spec=SPEC,
            options=OPTIONS,
            clock=ManualClock(),
        )
    assert result.summary.exit_code == 0
    assert result.summary.accepted == SPEC.total_batches


async def test_spool_full_of_undeliverable_frames_stops_producing(tmp_path: Path):
    down = CollectorState([Reply(503, {"error": "store_unavailable"})] * 1000)
    spec = LoadSpec(agents=1, batches=10, points_per_batch=3, seed=2)
    async with FakeCollectors(down) as collectors:
        result = await run_fleet(
            urls=collectors.urls,
            token="t",
            spool=SpoolSettings(tmp_path / "spool", max_pending_frames=2),
            spec=spec,
            options=OPTIONS,
            clock=ManualClock(),
        )
    assert result.summary.pending == 2 and result.summary.not_sent == 8
    assert result.summary.exit_code == 3


async def test_unexpected_conflict_and_poison_fail_the_run(tmp_path: Path):
    state = CollectorState(
        [
            Reply(409, {"error": "identity_conflict"}),
            Reply(400, {"error": "invalid_frame", "detail": "x"}),
        ]
    )
    spec = LoadSpec(agents=1, batches=3, points_per_batch=3, seed=2)
    async with FakeCollectors(state) as collectors:
        result = await run_fleet(
            urls=collectors.urls,
            token="t",
            spool=SpoolSettings(tmp_path / "spool"),
            spec=spec,
            options=RunOptions(policy=UploadPolicy(concurrency=1)),
            clock=ManualClock(),
        )
    summary = result.summary
    assert (summary.conflicts, summary.poison, summary.accepted) == (1, 1, 1)
    assert summary.exit_code == 1 and len(summary.unexpected) == 2


async def _cli(*args: str) -> tuple[int, str, str]:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent",
        "send",
        *args,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await child.communicate()
    assert child.returncode is not None
    return child.returncode, out.decode(), err.decode()


async def test_cli_synthetic_run_prints_json_summary(tmp_path: Path):
    state = CollectorState()
    token_file = tmp_path / "token"
    token_file.write_text("cli-token\n")
    truth_file = tmp_path / "truth.json"
    async with FakeCollectors(state, 2) as collectors:
        code, out, err = await _cli(
            "--url",
            ",".join(collectors.urls),
            "--token-file",
            str(token_file),
            "--spool-dir",
            str(tmp_path / "spool"),
            "--agents",
            "2",
            "--batches",
            "5",
            "--points-per-batch",
            "10",
            "--duplicate-rate",
            "0.5",
            "--conflict-rate",
            "0.5",
            "--seed",
            "9",
            "--json",
            "--truth-out",
            str(truth_file),
        )
    assert code == 0, err
    report = json.loads(out)
    assert report["seed"] == 9 and report["accepted"] == 10 and report["exit_code"] == 0
    assert report["conflicts"] == report["conflicts_injected"] > 0
    assert report["duplicates"] == report["duplicates_injected"] > 0
    assert {"ack_p50_ms", "ack_p99_ms", "retries", "poison"} <= set(report)
    assert all(r.headers["Authorization"] == "Bearer cli-token" for r in state.requests)
    truth = json.loads(truth_file.read_text())
    assert truth["accepted_totals"]["points"] == 100


async def test_cli_file_run_prints_table(tmp_path: Path):
    points = tmp_path / "points.jsonl"
    points.write_text(
        "".join(
            f'{{"ts": {1760000000000000000 + i}, "metric": "m", "value": {i}}}\n' for i in range(25)
        )
    )
    state = CollectorState()
    async with FakeCollectors(state) as collectors:
        code, out, err = await _cli(
            "--url",
            collectors.urls[0],
            "--token",
            "t",
            "--spool-dir",
            str(tmp_path / "s"),
            "--file",
            str(points),
            "--agent-id",
            "file-agent",
            "--points-per-batch",
            "10",
        )
    assert code == 0, err
    assert "accepted (new)" in out and "ack latency p99 (ms)" in out
    assert len(state.accepted) == 3


async def test_cli_bad_file_names_line_and_field(tmp_path: Path):
    points = tmp_path / "points.csv"
    points.write_text("ts,metric,value\n1,m,1\n2,m,oops\n")
    code, _, err = await _cli("--spool-dir", str(tmp_path / "s"), "--file", str(points))
    assert code == 2
    assert "points.csv:3: field 'value'" in err
