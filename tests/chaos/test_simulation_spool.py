"""The deterministic simulation with a local-spool collector landing in bundles (PROTOCOL
§3.4, §3.10 "Writing", spool mode; issue 33 "Correctness": the spool mutant).

`chaos.sim.spool`: agents whose batches are often followed by a conflicting twin
(answered 409, spooled to be quarantined) while the collector lands its spool in bundles
of at most one frame per identity, and restarts once mid-round. The world's own test
asserts no violation; the mutant's that the same world reports the frame answered 200
lost to the one answered 409. Seeds are chosen as in `tests/chaos/test_simulation_bundles.py`:
the first of a short scan whose world flags the mutant.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest

from chaos.sim.simulation import simulate
from collector.accept import AcceptanceUnavailable
from collector.bundles.spool_landing import SpooledFrame
from collector.local_spool.lander import LandingReport, SpoolLander
from tests.chaos.test_simulation_bundles import BUNDLED

SPOOL_WORLD = dataclasses.replace(BUNDLED, seed=0, spool_agents=3)
"""Three agents of one local-spool collector, 6 batches each, about half followed by a
conflicting twin within half a second. Seed 0 (the first of 0-5, all of which flag it)
flags `spool_windows_landing_at_once`."""


def spool_windows_landing_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A landing round lands its windows at once, a task each, instead of one after
    another: two frames of one identity (never in one window) have their manifest creates
    sent concurrently, in two bundles (PROTOCOL §3.10 spool mode: "manifest creates follow
    acknowledgement order across bundles")."""

    async def land_once(self: SpoolLander) -> LandingReport:
        report = LandingReport()
        windows: list[list[SpooledFrame]] = [[]]
        for path in self._spool.pending():
            item = await self._read(path, report)
            if item is None:
                continue
            if self._bundles.window_end([*windows[-1], item]) <= len(windows[-1]):
                windows.append([])
            windows[-1].append(item)

        async def land(window: list[SpooledFrame]) -> None:
            with contextlib.suppress(AcceptanceUnavailable):
                if len(window) == 1:
                    item = window[0]
                    result = await self._acceptor.accept(item.header, item.frame, item.sha)
                    await self._settle(item, result, report)
                    return
                async for item, result in self._bundles.land(window):
                    await self._settle(item, result, report)

        await asyncio.gather(*(land(window) for window in windows if window))
        return report

    monkeypatch.setattr(SpoolLander, "land_once", land_once)


def test_a_spool_landing_in_bundles_keeps_the_acknowledgement_order() -> None:
    report = simulate(SPOOL_WORLD)
    assert report.ok, report.violations
    stats = report.stats
    assert stats["spool_twins"] > 0 and stats["spool_409"] == stats["spool_twins"]
    assert stats["spool_bundled"] > 0 and stats["spool_restarts"] == 1


def test_spool_windows_landing_at_once_are_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    spool_windows_landing_at_once(monkeypatch)
    report = simulate(SPOOL_WORLD)
    assert any("acknowledged" in v and "but the manifest says" in v for v in report.violations), (
        report.violations
    )
