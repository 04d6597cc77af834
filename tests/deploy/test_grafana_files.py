"""deploy/grafana: the provisioned data source and the two dashboards, offline; and the
panel harness (`tests.deploy.grafana_panels`) held to Grafana's own test vectors
(Grafana 12.2, ``pkg/promlib/models/query_test.go``)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from agent.health import series_names as agent_series
from agent.scrape_target import DURATION as SCRAPE_DURATION
from agent.scrape_target import SAMPLES as SCRAPE_SAMPLES
from collector.metrics import CollectorMetrics
from config import load_settings
from reconciler.metrics import ReconcilerMetrics
from tests.deploy.deploy_files import DEPLOY, ROOT, read_unit
from tests.deploy.grafana_panels import (
    ALL,
    GRAFANA_VERSION,
    GrafanaTime,
    PanelTarget,
    Variable,
    backend_step_ms,
    format_value,
    go_duration,
    interpolate_builtins,
    interpolate_variables,
    load_dashboard,
    panel_requests,
    panel_targets,
    template_variables,
    variable_request,
)
from tests.deploy.grafana_requests import datasource_requests

yaml = pytest.importorskip("yaml", reason="PyYAML comes with the test extras (ministack)")

GRAFANA = DEPLOY / "grafana"
FLEET = GRAFANA / "dashboards" / "lightmetrics-fleet.json"
HEALTH = GRAFANA / "dashboards" / "lightmetrics-health.json"
SCHEMA_VERSION = 41  # Grafana 12 (pkg/apis/dashboard/migration/schemaversion/v41.go)
HOUR_MS = 3_600_000
T0_MS = 1_760_000_000_000
FLEET_VALUES: dict[str, str | list[str]] = {
    "job": ALL,
    "instance": ALL,
    "counter": "lm_collector_requests_total",
    "histogram": "lm_collector_ack_latency_seconds",
    "gauge": "lm_collector_in_flight_requests",
}
HEALTH_VALUES: dict[str, str | list[str]] = {"job": ALL}


def test_the_data_source_is_the_collector_with_a_bearer_read_token() -> None:
    document = yaml.safe_load((GRAFANA / "provisioning/datasources/lightmetrics.yaml").read_text())
    (source,) = document["datasources"]
    assert source["type"] == "prometheus" and source["access"] == "proxy"
    assert source["url"] == "${LIGHTMETRICS_URL}"
    assert source["jsonData"]["httpHeaderName1"] == "Authorization"
    assert source["secureJsonData"]["httpHeaderValue1"] == "Bearer ${LIGHTMETRICS_READ_TOKEN}"
    assert "httpHeaderValue1" not in source["jsonData"]  # never in plain jsonData
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/lightmetrics.yaml").read_text())
    assert providers["providers"][0]["type"] == "file"


@pytest.mark.parametrize("path", [FLEET, HEALTH], ids=lambda p: p.stem)
def test_dashboards_are_grafana_12_models_with_unique_panel_ids(path: Path) -> None:
    dashboard = load_dashboard(path)
    assert dashboard["schemaVersion"] == SCHEMA_VERSION
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for target in panel_targets(dashboard):
        assert re.fullmatch(r"[A-Z]", target.ref_id)


def test_the_fleet_dashboard_is_generic_with_eight_panels_or_more() -> None:
    dashboard = load_dashboard(FLEET)
    panels = {t.panel_id for t in panel_targets(dashboard)}
    assert len(panels) >= 8
    names = [v.name for v in template_variables(dashboard)]
    assert names == ["job", "instance", "counter", "histogram", "gauge"]
    exprs = " ".join(t.expr for t in panel_targets(dashboard))
    for needed in ("$__rate_interval", "$__interval]", "$__range", "histogram_quantile", "topk"):
        assert needed in exprs
    assert "lm_" not in exprs  # the fleet's metrics, whatever they are
    # Only what every scraper writes (lm-agent scrape, Prometheus, the OpenTelemetry
    # Collector's prometheus receiver): `up`, scrape_duration_seconds and
    # scrape_samples_scraped, not the relabelling and churn series lm-agent does not make;
    # the end-to-end test reads the dashboard through the collector.
    used = set(re.findall(r"\bscrape_[a-z_]+", exprs))
    assert used == {SCRAPE_DURATION, SCRAPE_SAMPLES}


def test_the_health_dashboard_reads_only_metrics_the_daemons_export() -> None:
    exported = set()
    for registry in (CollectorMetrics().registry, ReconcilerMetrics().registry):
        for metric in registry.collect():
            exported |= {sample.name for sample in metric.samples}
            exported |= {f"{metric.name}_bucket", f"{metric.name}_count", f"{metric.name}_total"}
    exported |= agent_series()  # what lm-agent scrape records about itself
    dashboard = load_dashboard(HEALTH)
    used = set()
    for target in panel_targets(dashboard):
        used |= set(re.findall(r"\blm_[a-z_]+", target.expr))
    for variable in template_variables(dashboard):
        used |= set(re.findall(r"\blm_[a-z_]+", variable.query))
    assert used - exported == set()
    for topic in (
        "lm_collector_requests_total",  # acceptance rate and answers by outcome
        "lm_store_request_seconds_bucket",  # store latency
        "lm_reconciler_log_lag_seconds",  # catalog lag
        "lm_reconciler_last_audit_completed_timestamp_seconds",  # audit age
        "lm_reconciler_gc_deletions_total",  # GC
        "lm_reconciler_raw_retention_retired_batches",  # raw retention
        "lm_reconciler_rollup_included_through_timestamp_seconds",  # rollup lag
        "lm_reconciler_sealed_through_timestamp_seconds",  # sealed hours
        "lm_agent_spool_pending_frames",  # agents that cannot deliver
    ):
        assert topic in used


@pytest.mark.parametrize(
    ("path", "values"), [(FLEET, FLEET_VALUES), (HEALTH, HEALTH_VALUES)], ids=["fleet", "health"]
)
def test_every_panel_becomes_a_complete_request(
    path: Path, values: dict[str, str | list[str]]
) -> None:
    dashboard = load_dashboard(path)
    time = GrafanaTime(T0_MS - 6 * HOUR_MS, T0_MS, max_data_points=1_000, scrape_interval="15s")
    requests = panel_requests(dashboard, time, values)
    assert len(requests) == len(panel_targets(dashboard))
    for request in requests:
        assert "$" not in request.expr and "[[" not in request.expr, request
        assert request.expr.count("(") == request.expr.count(")"), request
        if request.step_s is not None:
            # 6 h over 1,000 points: 21.6 s rounds to 20 s; the range aligned to it.
            assert request.step_s == 20.0
            assert request.start_s % 20 == 0 and request.end_s % 20 == 0
    # $__rate_interval = max(interval 20s + scrape 15s, 4 * 15s) = 60 s, as Go writes it.
    assert any("[1m0s]" in r.expr for r in requests)


def test_the_harness_matches_grafanas_own_vectors() -> None:
    """pkg/promlib/models/query_test.go (Grafana 12.2): the step and the built-ins."""
    two_days = GrafanaTime(0, 48 * HOUR_MS, max_data_points=0, scrape_interval="15s")
    target = PanelTarget(1, "t", "A", 'rate(ALERTS{job="test" [$__interval]})', False)
    step = backend_step_ms(two_days, interval_ms=60_000, max_data_points=0, target=target)
    assert step == 120_000

    def built(expr: str) -> str:
        return interpolate_builtins(
            expr,
            step_ms=step,
            interval_ms=60_000,
            range_ms=two_days.range_ms,
            min_step="",
            scrape="15s",
        )

    assert built(target.expr) == 'rate(ALERTS{job="test" [2m]})'
    assert built("[$__range]") == "[172800s]"
    assert built("[$__interval_ms]") == "[120000]"
    five_minutes = GrafanaTime(0, 5 * 60_000, max_data_points=0, scrape_interval="15s")
    rate = PanelTarget(1, "t", "A", "[$__rate_interval]", False, interval="5m")
    step = backend_step_ms(five_minutes, interval_ms=60_000, max_data_points=0, target=rate)
    assert step == 300_000
    assert (
        interpolate_builtins(
            rate.expr,
            step_ms=step,
            interval_ms=60_000,
            range_ms=300_000,
            min_step="5m",
            scrape="15s",
        )
        == "[20m0s]"
    )
    assert (
        interpolate_builtins(
            "[$__range_s]", step_ms=1, interval_ms=1, range_ms=800, min_step="", scrape="15s"
        )
        == "[1]"
    )
    assert [go_duration(ms) for ms in (4_000, 60_000, 1_500, 500, 7_200_000)] == [
        "4s",
        "1m0s",
        "1.5s",
        "500ms",
        "2h0m0s",
    ]


def test_template_variables_are_formatted_as_grafanas_prometheus_data_source_does() -> None:
    multi = Variable("job", "", multi=True, include_all=True, all_value=".+")
    single = Variable("metric", "")
    assert format_value(["a.b", "c"], multi) == "(a\\\\.b|c)"
    assert format_value(["a.b"], multi) == "a\\\\.b"
    assert format_value("it's", single) == "it\\\\'s"
    variables = {"job": multi, "metric": single}
    values: dict[str, str | list[str]] = {"job": ALL, "metric": "up"}
    text = 'rate(${metric}{job=~"$job"}[$__rate_interval]) + [[metric]]'
    assert interpolate_variables(text, variables, values) == (
        'rate(up{job=~".+"}[$__rate_interval]) + up'
    )


def test_variable_queries_are_the_names_endpoints_grafana_calls() -> None:
    time = GrafanaTime(T0_MS - HOUR_MS + 1, T0_MS, scrape_interval="15s")
    dashboard = load_dashboard(FLEET)
    variables = {v.name: v for v in template_variables(dashboard)}
    job = variable_request(variables["job"], time, variables, {})
    assert job.path == "/api/v1/label/job/values"
    assert job.params == {
        "match[]": "up",
        "start": str(T0_MS // 1000 - 3599),
        "end": str(T0_MS // 1000),
    }
    instance = variable_request(variables["instance"], time, variables, {"job": ALL})
    assert instance.params["match[]"] == 'up{job=~".+"}'
    histogram = variable_request(variables["histogram"], time, variables, {})
    assert histogram.path == "/api/v1/label/__name__/values"
    assert histogram.options(["a_bucket", "a_count", "b_total"]) == ["a"]


def test_the_replay_list_holds_every_request_grafana_makes() -> None:
    time = GrafanaTime(T0_MS - HOUR_MS, T0_MS, scrape_interval="15s")
    requests = datasource_requests(time, metric="lm_collector_requests_total")
    paths = [(r.method, r.path) for r in requests]
    assert ("POST", "/api/v1/query") in paths and ("GET", "/api/v1/status/buildinfo") in paths
    for path in ("/api/v1/labels", "/api/v1/series", "/api/v1/metadata", "/api/v1/query_exemplars"):
        assert any(p == path for _m, p in paths)
    (rate,) = [r for r in requests if r.path == "/api/v1/query_range"]
    assert dict(rate.params)["query"] == "sum by (job) (rate(lm_collector_requests_total[1m0s]))"
    assert GRAFANA_VERSION == "12.2"


def test_self_scrape_targets_every_daemon_where_its_example_settings_serve_metrics() -> None:
    """deploy/systemd/self-scrape.toml: one target per collector worker ([metrics] port +
    index, for the unit's default --workers), the query collector's HTTP port (one worker)
    and the reconciler's [metrics] port."""
    scrape = load_settings(DEPLOY / "systemd/self-scrape.toml", environ={}).scrape
    ports: dict[str, set[int]] = {}
    for target in scrape.targets:
        ports.setdefault(target.labels["job"], set()).add(urlsplit(target.url).port or 80)
    collector = load_settings(ROOT / "config/examples/collector.toml", environ={})
    reconciler = load_settings(ROOT / "config/examples/reconciler.toml", environ={})
    unit = read_unit(DEPLOY / "systemd/lightmetrics-collector.service")
    (workers,) = [
        int(v.split("=", 1)[1])
        for v in unit.values("Service", "Environment")
        if v.startswith("LIGHTMETRICS_COLLECTOR_WORKERS=")
    ]
    query = load_settings(DEPLOY / "systemd/query-collector.toml", environ={})
    assert ports == {
        "lightmetrics-collector": {collector.metrics.port + i for i in range(workers)}
        | {query.http.port},
        "lightmetrics-reconciler": {reconciler.metrics.port},
    }
    # Every target names its host: lm-agent's default instance (127.0.0.1:port) is the
    # same on every host, whose series would then present one label set.
    instances = [t.labels.get("instance", "") for t in scrape.targets]
    assert len(set(instances)) == len(instances) and not any(
        i.startswith("127.") for i in instances
    )
    self_unit = read_unit(DEPLOY / "systemd/lightmetrics-self-scrape.service")
    assert "scrape --config /etc/lightmetrics/self-scrape.toml" in self_unit.value(
        "Service", "ExecStart"
    )


def test_each_collector_and_reconciler_pod_scrapes_itself_into_the_store() -> None:
    """deploy/kubernetes: a self-scrape sidecar per pod, scraping its own daemon on
    127.0.0.1 under the systemd jobs' names, each pod its own instance and agent."""
    import json

    ports = {"lightmetrics-collector": 8080, "lightmetrics-reconciler": 9108}
    for name, job in (
        ("collector", "lightmetrics-collector"),
        ("query-collector", "lightmetrics-collector"),
        ("reconciler", "lightmetrics-reconciler"),
    ):
        documents = yaml.safe_load_all((DEPLOY / f"kubernetes/{name}-deployment.yaml").read_text())
        (deployment,) = [d for d in documents if d and d["kind"] == "Deployment"]
        spec = deployment["spec"]["template"]["spec"]
        (sidecar,) = [c for c in spec["containers"] if c["name"] == "self-scrape"]
        assert sidecar["args"][0] == "scrape"
        env = {e["name"]: e.get("value") for e in sidecar["env"]}
        (target,) = json.loads(env["LM_SCRAPE__TARGETS"])
        assert target == {
            "url": f"http://127.0.0.1:{ports[job]}/metrics",
            "labels": {"job": job, "instance": "$(POD_NAME)"},
        }
        assert env["LM_SCRAPE__AGENT_ID"] == "self-$(POD_NAME)"
        assert [e["name"] for e in sidecar["env"]].index("POD_NAME") == 0  # defined before use
    scrape = load_settings(DEPLOY / "kubernetes/self-scrape.toml", environ={}).scrape
    assert scrape.collector_urls == ["http://lightmetrics-collector.lightmetrics.svc:8080"]
