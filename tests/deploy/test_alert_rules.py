"""The alerts deploy/README.md recommends are valid Prometheus rules (``promtool check
rules``, the real tool), and every ``lm_*`` metric they name is one a process exports or
records: an operator can paste them as they are."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from agent.health import series_names as agent_series
from collector.metrics import CollectorMetrics
from tests.deploy.deploy_files import DEPLOY
from tests.prometheus_binary import PROMTOOL, require_prometheus

README = DEPLOY / "README.md"


def recommended_rules() -> str:
    text = README.read_text()
    section = text[text.index("## Alerts worth having") :]
    match = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert match, "no yaml block under 'Alerts worth having'"
    return match.group(1)


def test_the_recommended_alerts_pass_promtool(tmp_path: Path) -> None:
    require_prometheus()
    assert PROMTOOL is not None
    rules = tmp_path / "rules.yml"
    rules.write_text(recommended_rules())
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert re.search(r"SUCCESS: \d+ rules found", checked.stdout), checked.stdout


def test_the_recommended_alerts_name_only_metrics_that_exist() -> None:
    known: set[str] = set()
    for metric in CollectorMetrics().registry.collect():
        known |= {sample.name for sample in metric.samples}
        known |= {f"{metric.name}_bucket", f"{metric.name}_total"}
    known |= agent_series()
    used = set(re.findall(r"\blm_[a-z_]+", recommended_rules()))
    assert used and used - known == set()
