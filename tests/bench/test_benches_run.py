"""Benchmarks that rotted unseen run end to end at a tiny size, and agree with their same-run
baselines: `bench.plan_hour` (its ledger lacked columns added later), `bench.audit_listing`
(it expected the listing kinds before `raw-bundles/v1/`), and the catalog benchmarks
beside them. Sizes here say nothing about speed: they only check that the benchmarks
work (the others were run by hand at a small size, eleventh session)."""

from __future__ import annotations

import re
import subprocess
import sys

from bench._common import REPO_ROOT


def _run(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_catalog_hour_phases_agree_on_the_hours_totals() -> None:
    stdout = _run(
        "bench.catalog_hour", "--rows", "4000", "--files", "20",
        "--phases", "aggregate,levels,grace,totals",
    )  # fmt: skip
    setsums = re.findall(r"'setsum': '([0-9a-f]+)'", stdout)
    assert len(setsums) == 6 and len(set(setsums)) == 1, stdout
    batches = re.findall(r"'batches': (\d+)", stdout)
    assert batches == ["4000"] * 6, stdout
    grace = re.search(r"hour in the grace .* (\d+) catalog GETs against (\d+)", stdout)
    assert grace is not None and grace.group(1) == "1" and int(grace.group(2)) > 1, stdout


def test_plan_hour_plans_every_batch_and_the_half_the_ledger_lacks() -> None:
    stdout = _run("bench.plan_hour", "--rows", "4000", "--files", "20")
    assert "plan, empty ledger: 4,000 batches" in stdout, stdout
    assert "plan, half in the ledger: 2,000 batches" in stdout, stdout


def test_moved_rows_names_the_same_rows_as_its_baseline() -> None:
    stdout = _run("bench.moved_rows", "--rows", "3000")
    assert "moved: 1000 moved rows" in stdout and "same rows: True" in stdout, stdout


def test_audit_listing_lists_every_seeded_key() -> None:
    """It starts MiniStack itself, and checks each run listed what it seeded."""
    stdout = _run("bench.audit_listing", "--manifests", "2000", "--agents", "20")
    assert stdout.count("4,000 keys in") == 2, stdout


def test_check_groups_times_every_phase() -> None:
    stdout = _run(
        "bench.check_groups", "--frames", "16", "--points", "50", "--groups", "4", "--rounds", "1"
    )  # fmt: skip
    assert "16 frames of 50 points" in stdout, stdout
    for phase in ("read only (the floor)", "one at a time", "groups of 4"):
        assert phase in stdout, stdout


def test_s3_client_cpu_measures_both_paths() -> None:
    """It starts MiniStack itself; each phase checks it took its own path."""
    stdout = _run("bench.s3_client_cpu", "--requests", "20", "--rounds", "2")
    for kind in ("put", "get"):
        for phase in ("round 1 {} sdk (baseline)", "round 2 {} direct", "{}: median"):
            assert phase.format(kind) in stdout, stdout
