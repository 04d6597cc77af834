"""``lm-chaos run --bundles`` (issue 33): the flag reaches the run's options, and its load
has frames in flight together (the run itself: chaos/RESULTS.md)."""

from __future__ import annotations

from pathlib import Path

from chaos.__main__ import build_parser
from chaos.load import LoadShape
from chaos.runner import ChaosOptions, bundle_load
from chaos.scenarios import SCENARIOS


def test_the_flag_is_parsed_and_off_by_default() -> None:
    base = ["run", "--scenario", "all", "--duration", "10"]
    assert build_parser().parse_args([*base, "--bundles"]).bundles is True
    assert build_parser().parse_args(base).bundles is False
    assert ChaosOptions("all", 1, 10.0, work_dir=Path("unused")).bundles is False


def test_bundle_load_sends_more_batches_at_once_and_keeps_the_rest() -> None:
    for scenario in SCENARIOS.values():
        shape = bundle_load(scenario.load)
        assert shape.concurrency >= max(16, scenario.load.concurrency)
        assert shape.batches == scenario.load.batches and shape.agents == scenario.load.agents
    assert bundle_load(LoadShape(concurrency=8)).concurrency == 32
