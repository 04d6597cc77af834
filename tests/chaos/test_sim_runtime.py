"""The virtual-time loop of the simulation (`chaos.sim.runtime`): timers jump time, work
handed to a thread runs inline, and waiting for "the rest" of an interval whose rest is
below the clock's float resolution still moves time (it used to spin forever); and the
``lm-chaos simulate`` command that runs worlds one after another."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

import chaos.__main__ as chaos_cli
from chaos.sim.runtime import run_virtual

LEVEL_BEFORE_ANY_TEST = os.environ.get("LM_LOGGING__LEVEL")  # read when pytest collects


def test_sleeping_jumps_virtual_time() -> None:
    async def main() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600.0)
        return loop.time()

    assert run_virtual(main) == 3600.0


def test_thread_work_runs_inline_at_the_same_virtual_instant() -> None:
    caller = threading.get_ident()

    async def main() -> tuple[int, float, float]:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(5.0)
        before = loop.time()
        ident = await asyncio.to_thread(threading.get_ident)
        return ident, before, loop.time()

    ident, before, after = run_virtual(main)
    assert ident == caller  # a real thread would finish at a real, machine-dependent moment
    assert before == after == 5.0


def test_a_wait_below_the_clocks_resolution_still_moves_time() -> None:
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(2.550413483379516)
        before = loop.time()
        tiny = 2.220446049250313e-16
        assert before + tiny == before  # the rest of an interval, lost in rounding
        await asyncio.sleep(tiny)
        return before, loop.time()

    before, after = run_virtual(main)
    assert after > before


def test_a_writer_waiting_for_the_rest_of_its_flush_interval_gets_there() -> None:
    """The shape of `index.log_writer.IndexLogWriter._run`: wait for the event or for
    the rest of the interval, until the interval has passed (bounded here: it used to
    loop without end at the same virtual instant)."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(1.550413483379516)
        oldest = loop.time()
        await asyncio.sleep(0.9999999999999998)  # the clock lands just short of 1.0 s
        wake = asyncio.Event()
        for rounds in range(100):
            rest = 1.0 - (loop.time() - oldest)
            if rest <= 0:
                return rounds
            try:
                await asyncio.wait_for(wake.wait(), rest)
            except TimeoutError:
                pass
        return -1

    rounds = run_virtual(main)
    assert 0 <= rounds < 100


def test_lm_chaos_simulate_reports_progress_and_a_summary(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lm-chaos simulate`` is long work: a line every ``SIMULATE_PROGRESS_EVERY`` worlds,
    then the summary and the GC coverage, exit 0 when no world broke an invariant; and
    none of the errors its worlds' processes log for the faults it injects (critical only,
    by default). The worlds' faults are real: at ``--log-level error`` they are logged."""
    monkeypatch.setattr(chaos_cli, "SIMULATE_PROGRESS_EVERY", 1)
    code = chaos_cli.main(["simulate", "--seed", "0", "--count", "2"])
    err = capsys.readouterr().err.splitlines()
    assert code == 0
    assert err[0].startswith("1 of 2 worlds, 0 with violations, ")
    assert err[1:3] == ["2 simulated worlds, 0 with violations", err[2]]
    assert err[2].startswith("GC coverage: ") and len(err) == 3, err

    assert chaos_cli.main(["simulate", "--seed", "0", "--count", "1", "--log-level", "error"]) == 0
    assert "injected" in capsys.readouterr().err
    # `--log-level` reached this process's environment (`config.cli`, for the processes it
    # starts); the root fixture `restore_logging` takes it out again after this test.
    assert os.environ["LM_LOGGING__LEVEL"] == "error"


def test_the_log_level_flag_of_the_test_before_is_gone() -> None:
    """`restore_logging` at work: the test above set ``LM_LOGGING__LEVEL``; tests after it
    (and the collectors they start) must not inherit it (in CI it once silenced the info
    lines of a collector that ``tests/config/test_cli.py`` starts)."""
    assert os.environ.get("LM_LOGGING__LEVEL") == LEVEL_BEFORE_ANY_TEST
