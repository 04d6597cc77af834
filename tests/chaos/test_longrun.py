"""The long simulated run of issue 31 (`chaos.longrun.run`): its CI version, which must
run in a minute of wall time and reach its own minimum counts, and the judgement of its
figures (`chaos.longrun.figures`) on timelines made by hand.

The full version (two simulated days, minutes of wall time) is ``lm-chaos longrun``;
its figures are recorded in ``chaos/RESULTS.md``.
"""

from __future__ import annotations

import dataclasses

from chaos.longrun.config import DAY_S, Minimums, longrun_settings
from chaos.longrun.figures import measure, shortfalls
from chaos.longrun.run import CI, run_longrun
from chaos.longrun.watch import BoundSample, LongRunWatch, PlantedOrphan
from protocol import keys

NOTHING_NEEDED = Minimums(0, 0, 0, 0, 0, 0)
HOUR = keys.UtcHour.from_unix_ns(1_760_000_400 * keys.NS_PER_S)


def test_the_ci_long_run_keeps_every_claim() -> None:
    """The CI version: 27 simulated hours in ~20 s of wall time on a quiet machine (the
    issue's bound is 60 s; chaos/RESULTS.md records it). Wall time is measured there, not
    asserted here: a test asserts behaviour, and a loaded machine is no failure."""
    report = run_longrun(CI)
    print(report.render())  # the figures, for the CI log (pytest -s)
    assert report.ok, report.render()
    figures = report.figures
    assert figures.steady_in_time == figures.steady_judged >= CI.minimums.steady_batches
    assert figures.stalled == 0
    assert report.stats["collector_kills"] and report.stats["collector_lost_flushes"]
    assert report.stats["resends"] and report.log_events["audit_finished"] >= 12


def test_a_run_too_short_to_prove_anything_fails() -> None:
    """No claim passes on 0 of 0: an hour of the CI world has no orphan due, no retired
    blob due, no deleted segment."""
    report = run_longrun(dataclasses.replace(CI, duration_s=3600.0, quiet_s=600.0))
    assert not report.ok
    said = "\n".join(report.shortfalls)
    for what in ("orphans due", "retired raw blobs due", "log segments deleted"):
        assert f"only 0 {what} (at least" in said, (what, said)


def test_the_settings_are_the_shortest_retention_the_checks_allow() -> None:
    settings = longrun_settings(CI)
    assert settings.reconciler.segment_retention_s == settings.gc.retry_horizon_s + DAY_S
    assert settings.reconciler.max_audit_interval_s == CI.audit_interval_s
    assert settings.retention.raw_days is not None and settings.gc.enabled


# --- the judgement, on timelines made by hand ---------------------------------------------


def watch() -> LongRunWatch:
    return LongRunWatch(now_s=lambda: 0.0)


def judged(w: LongRunWatch, end_s: float = 10 * 3600.0, **counts: int) -> list[str]:
    config = dataclasses.replace(CI, minimums=NOTHING_NEEDED)
    figures = measure(
        w,
        config,
        end_s=end_s,
        collisions=counts.get("collisions", 0),
        collision_runs=counts.get("collision_runs", 0),
        stalled=counts.get("stalled", 0),
    )
    return shortfalls(figures, config)


def test_a_batch_cataloged_later_than_two_loop_intervals_after_its_row_is_a_shortfall() -> None:
    w = watch()
    bound = 2 * CI.loop_interval_s
    for key, waited in (("accepted/v1/a", bound), ("accepted/v1/b", bound + 1)):
        w.created_s[key] = 100.0
        w.row_landed_s[key] = 110.0
        w.cataloged[key] = (110.0 + waited, "steady")
    found = judged(w)
    assert len(found) == 1 and "1 of 2 batches were not cataloged" in found[0]
    assert "accepted/v1/b" in found[0]


def test_a_batch_whose_row_was_lost_waits_for_an_audit_at_most_two_intervals() -> None:
    w = watch()
    w.created_s["accepted/v1/lost"] = 100.0  # no row ever landed
    w.cataloged["accepted/v1/lost"] = (100.0 + 2 * CI.audit_interval_s, "audit")
    assert judged(w) == []
    w.cataloged["accepted/v1/lost"] = (101.0 + 2 * CI.audit_interval_s, "audit")
    assert "waited more than 2 audit intervals" in judged(w)[0]


def test_orphans_below_95_percent_in_time_are_a_shortfall() -> None:
    w = watch()
    deadline = CI.retry_horizon_s + 2 * CI.audit_interval_s
    for n in range(20):
        w.orphans.append(PlantedOrphan(f"{n:064x}", 0.0, logged=n % 2 == 0))
        w.blob_deleted_s[f"{n:064x}"] = [deadline if n else deadline + 1]
    assert judged(w) == []  # 19 of 20: 95 %
    w.blob_deleted_s[f"{1:064x}"] = []
    assert "only 18 of 20 orphans" in judged(w)[0]


def test_a_retired_blob_left_for_more_than_a_day_is_a_shortfall() -> None:
    w = watch()
    w.manifest_hour["accepted/v1/r"] = HOUR
    w.manifest_sha["accepted/v1/r"] = "a" * 64
    w.retirements.append((3600.0, HOUR.start_ns + 3600 * keys.NS_PER_S))
    end = 3600.0 + DAY_S + 1
    w.blob_deleted_s["a" * 64] = [3600.0 + DAY_S]
    assert judged(w, end_s=end) == []
    w.blob_deleted_s["a" * 64] = [3600.0 + DAY_S + 1]
    assert "retired raw blobs were not deleted within a day" in judged(w, end_s=end)[0]


def test_a_stall_and_unbounded_segments_and_entries_are_shortfalls() -> None:
    w = watch()
    w.samples.append(BoundSample(0.0, 10, 0.0, 10, 0.0, 1, 0, 0))
    assert judged(w, stalled=0) == []
    assert judged(w, stalled=1) == ["lm_reconciler_gc_stalled_total = 1"]
    w.samples.append(BoundSample(DAY_S, 10, CI.segment_retention_s + 1300 + 2 * 600, 1, 0, 1, 0, 0))
    w.samples.append(BoundSample(DAY_S, 10, 0.0, 1, 2 * CI.audit_interval_s + 6001, 1, 0, 0))
    found = judged(w)
    assert len(found) == 2
    assert "oldest log segment" in found[0] and "oldest catalog-created entry" in found[1]
