"""The requests Grafana's Prometheus data source sends on its own, written out as data
(method, path, params) for a test to replay against the query collector (issue 32 item 5).

Each entry names where in Grafana 12.2 it comes from (grafana/grafana main,
``@grafana/prometheus`` 12.2.0-pre; the server-side client since Grafana 10):

- ``pkg/promlib/healthcheck.go``: "Save & test" runs the instant query ``1+1`` with refId
  ``__healthcheck__`` over the time range 1 s .. 4 s: ``GET /api/v1/query?query=1%2B1&time=4``;
- ``pkg/promlib/heuristics.go``: then ``GET /api/v1/status/buildinfo`` (no parameters)
  to tell Prometheus from Mimir by ``data.features``;
- ``packages/grafana-prometheus/src/language_provider.ts``: the query editor's metrics
  browser: ``/api/v1/label/__name__/values`` (start, end), ``/api/v1/labels`` with
  ``match[]`` for a metric, ``/api/v1/label/<name>/values`` with ``match[]``,
  ``/api/v1/series`` with ``match[]`` and ``limit=40000`` (``DEFAULT_SERIES_LIMIT``),
  ``/api/v1/metadata`` (no parameters); start and end are whole seconds
  (``getPrometheusTime``: ``ceil(ms / 1000)``);
- ``packages/grafana-prometheus/src/datasource.ts`` ``areExemplarsAvailable``: at start,
  ``GET /api/v1/query_exemplars?query=test&start=<now-30m ms>&end=<now ms>`` (in
  milliseconds, as Grafana sends it; Prometheus parses either), then for a panel with
  exemplars on, ``/api/v1/query_exemplars`` with the query and the aligned range
  (``pkg/promlib/client/client.go`` ``QueryExemplars``);
- ``pkg/promlib/client/client.go`` ``QueryRange``: ``/api/v1/query_range`` with the
  expression after ``$__rate_interval`` was replaced (`tests.deploy.grafana_panels`).

Grafana's default HTTP method is POST for the query endpoints (form-encoded body); the
label values, metadata and buildinfo endpoints are GET only (``endpointsSupportOnlyGet``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.deploy.grafana_panels import GrafanaTime, PanelTarget, panel_request

SERIES_LIMIT = "40000"  # packages/grafana-prometheus/src/constants.ts DEFAULT_SERIES_LIMIT


@dataclass(frozen=True, slots=True)
class GrafanaRequest:
    what: str
    method: str
    path: str
    params: tuple[tuple[str, str], ...]
    """In order; a key may repeat (``match[]``)."""


def datasource_requests(
    time: GrafanaTime, *, metric: str, label: str = "job", method: str = "POST"
) -> list[GrafanaRequest]:
    """What Grafana sends for a data source whose queries read ``metric`` (a counter with
    a ``label``), over ``time``, with its HTTP method set to ``method``."""
    start = str(-(-time.start_ms // 1000))
    end = str(-(-time.end_ms // 1000))
    span = (("start", start), ("end", end))
    rate = panel_request(
        PanelTarget(
            0, "rate panel", "A", f"sum by ({label}) (rate({metric}[$__rate_interval]))", False
        ),
        time,
        {},
        {},
    )
    exemplars = panel_request(PanelTarget(0, "exemplars", "A", metric, False), time, {}, {})
    return [
        GrafanaRequest("health check", method, "/api/v1/query", (("query", "1+1"), ("time", "4"))),
        GrafanaRequest("buildinfo", "GET", "/api/v1/status/buildinfo", ()),
        GrafanaRequest("metric names", "GET", "/api/v1/label/__name__/values", span),
        GrafanaRequest(
            "label names of a metric", method, "/api/v1/labels", (*span, ("match[]", metric))
        ),
        GrafanaRequest(
            "label values of a metric",
            "GET",
            f"/api/v1/label/{label}/values",
            (*span, ("match[]", metric)),
        ),
        GrafanaRequest(
            "series of a metric",
            method,
            "/api/v1/series",
            (*span, ("match[]", metric), ("limit", SERIES_LIMIT)),
        ),
        GrafanaRequest("metadata", "GET", "/api/v1/metadata", ()),
        GrafanaRequest(
            "exemplars available?",
            method,
            "/api/v1/query_exemplars",
            (
                ("query", "test"),
                ("start", str(time.end_ms - 30 * 60_000)),
                ("end", str(time.end_ms)),
            ),
        ),
        GrafanaRequest(
            "exemplars of a panel",
            method,
            "/api/v1/query_exemplars",
            (
                ("query", metric),
                ("start", exemplars.params()["start"]),
                ("end", exemplars.params()["end"]),
            ),
        ),
        GrafanaRequest("rate panel", method, "/api/v1/query_range", tuple(rate.params().items())),
    ]
