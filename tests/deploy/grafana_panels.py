"""The requests Grafana makes for a dashboard's panels and template variables, computed as
Grafana computes them, so a test can run every panel without a Grafana binary.

Taken from Grafana 12.2's Prometheus data source (grafana/grafana main at the time of
writing, ``@grafana/prometheus`` 12.2.0-pre; the backend query path has been the same
since Grafana 10, when queries moved to the server):

- **template variables** (frontend, ``packages/grafana-prometheus/src/datasource.ts``:
  ``interpolateQueryExpr``, ``prometheusRegularEscape``, ``prometheusSpecialRegexEscape``,
  and the template service's ``$var`` / ``${var}`` / ``[[var]]`` syntax): a single-value
  variable is inserted with backslashes and single quotes escaped; a multi-value or
  include-All variable has regex metacharacters escaped and several values become
  ``(a|b)``; "All" with a custom ``allValue`` inserts it as it is;
- **the interval** (frontend, ``rangeutil.calculateInterval``, from the panel query
  runner): ``roundInterval(range / maxDataPoints)``, at least the panel's min interval or
  the data source's ``timeInterval`` (its scrape interval, default 15s);
- **the step and the built-in variables** (backend, ``pkg/promlib/models/query.go``:
  ``calculatePrometheusInterval``, ``calculateRateInterval``, ``InterpolateVariables``;
  ``pkg/promlib/intervalv2``; grafana-plugin-sdk-go ``backend/gtime``): the step is
  ``max(roundInterval(range / maxDataPoints) or the min interval, roundInterval(range /
  11000)) * intervalFactor``; ``$__interval`` is the step in Grafana's units (``2m``),
  ``$__rate_interval`` is ``max($__interval + scrape interval, 4 * scrape interval)`` in
  Go's duration form (``1m0s``), ``$__range`` the range in whole seconds (``3600s``);
- **the requests** (backend, ``pkg/promlib/client/client.go``): a range query's start
  and end are floored to a multiple of the step (``AlignTimeRange``, UTC), times are
  seconds as decimals; an instant query is evaluated at the range's end, unaligned.
- **variable queries** (``metric_find_query.ts``): ``label_values(label)`` and
  ``label_values(selector, label)`` GET ``/api/v1/label/<label>/values`` (``match[]``
  when there is a selector; Prometheus >= 2.24 has it), ``metrics(regex)`` GETs
  ``/api/v1/label/__name__/values`` and filters the names by ``regex`` in the browser;
  start and end are ``ceil(ms / 1000)`` of the range.

The end-to-end test (``tests/deploy/test_grafana_panels.py``: the daemons scrape
themselves into the store with ``lm-agent scrape``, the panels go through the query
collector's own API) uses these functions: they produce requests, and the test decides
where to send them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GRAFANA_VERSION = "12.2"
"""The Grafana release whose Prometheus data source these rules were taken from."""
SAFE_RESOLUTION = 11_000  # pkg/promlib/models/query.go safeResolution
DEFAULT_RESOLUTION = 1_500  # pkg/promlib/intervalv2 DefaultRes, when maxDataPoints is 0
DEFAULT_SCRAPE_INTERVAL = "15s"  # the data source's timeInterval when unset
MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
# The template service's variable syntax: $var, [[var]] / [[var:fmt]], ${var} / ${var:fmt}.
_VARIABLE = re.compile(
    r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^}]+))?(?::([^}]+))?\}"
)
_REGEX_META = re.compile(r"[$^*{}\[\]+?.()|]")
# metric_find_query.ts: label_values((selector, )label) and metrics(regex).
_LABEL_VALUES = re.compile(r"^label_values\((?:(.+),\s*)?([a-zA-Z_][a-zA-Z0-9_]*)\)\s*$")
_METRICS = re.compile(r"^metrics\((.+)\)\s*$")
ALL = "$__all"


# --- durations as Grafana reads and writes them ------------------------------------------


def parse_duration_ms(text: str) -> int:
    """``15s``, ``1m30s``, ``500ms``, or a bare number of seconds, in milliseconds."""
    if text.isdigit():
        return int(text) * 1000
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Grafana duration: {text!r}")
    return round(sum(float(n) * MS[u] for n, u in parts))


_ROUNDING = (  # gtime.RoundInterval: (up to this many ms, round to this many ms)
    (10, 1), (15, 10), (35, 20), (75, 50), (150, 100), (350, 200), (750, 500),
    (1_500, 1_000), (3_500, 2_000), (7_500, 5_000), (12_500, 10_000), (17_500, 15_000),
    (25_000, 20_000), (45_000, 30_000), (90_000, 60_000), (210_000, 120_000),
    (450_000, 300_000), (750_000, 600_000), (1_050_000, 900_000), (1_500_000, 1_200_000),
    (2_700_000, 1_800_000), (5_400_000, 3_600_000), (9_000_000, 7_200_000),
    (16_200_000, 10_800_000), (32_400_000, 21_600_000), (86_400_000, 43_200_000),
    (172_800_000, 86_400_000), (604_800_000, 86_400_000), (1_814_400_000, 604_800_000),
)  # fmt: skip


def round_interval_ms(interval_ms: float) -> int:
    """gtime.RoundInterval (and the frontend's rangeutil.roundInterval): a rounder,
    smaller interval."""
    for limit, rounded in _ROUNDING:
        if interval_ms <= limit:
            return rounded
    return 2_592_000_000 if interval_ms < 3_628_800_000 else 31_536_000_000


def format_interval(ms: int) -> str:
    """gtime.FormatInterval: the largest whole unit (``2m``, ``1h``, ``500ms``)."""
    for unit, size in (("y", 365 * 86_400_000), ("d", 86_400_000), ("h", 3_600_000),
                       ("m", 60_000), ("s", 1000), ("ms", 1)):  # fmt: skip
        if ms >= size:
            return f"{ms // size}{unit}"
    return "1ms"


def go_duration(ms: int) -> str:
    """Go's ``time.Duration.String`` of whole milliseconds (``1m0s``, ``4s``, ``1.5s``,
    ``500ms``, ``2h0m0s``): how the backend writes ``$__rate_interval``."""
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{seconds}s"
    if minutes:
        return f"{minutes}m{seconds}s"
    return f"{seconds}s"


# --- the dashboard model --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Variable:
    name: str
    query: str
    regex: str = ""
    multi: bool = False
    include_all: bool = False
    all_value: str | None = None


@dataclass(frozen=True, slots=True)
class PanelTarget:
    panel_id: int
    panel_title: str
    ref_id: str
    expr: str
    instant: bool
    interval: str = ""
    """The target's min step (``interval``), or the panel's; ``""``: the data source's."""
    interval_factor: int = 1
    max_data_points: int | None = None


def load_dashboard(path: Path) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return dashboard


def _panels(panels: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Every panel, rows' collapsed panels included, in layout order."""
    found: list[Mapping[str, Any]] = []
    for panel in panels:
        found.append(panel)
        found.extend(_panels(panel.get("panels", [])))
    return found


def panel_targets(dashboard: Mapping[str, Any]) -> list[PanelTarget]:
    """Every query of every panel (hidden ones and rows skipped)."""
    targets = []
    for panel in _panels(dashboard.get("panels", [])):
        if panel.get("type") == "row":
            continue
        for target in panel.get("targets", []):
            if target.get("hide") or not target.get("expr"):
                continue
            targets.append(
                PanelTarget(
                    panel_id=int(panel["id"]),
                    panel_title=str(panel["title"]),
                    ref_id=str(target["refId"]),
                    expr=str(target["expr"]),
                    instant=bool(target.get("instant")) and not target.get("range"),
                    interval=str(target.get("interval") or panel.get("interval") or ""),
                    interval_factor=int(target.get("intervalFactor") or 1),
                    max_data_points=panel.get("maxDataPoints"),
                )
            )
    return targets


def template_variables(dashboard: Mapping[str, Any]) -> list[Variable]:
    """The dashboard's query variables in order (a later one may use an earlier one)."""
    found = []
    for item in dashboard.get("templating", {}).get("list", []):
        if item.get("type") != "query":
            continue
        query = item.get("query")
        text = query.get("query", "") if isinstance(query, Mapping) else str(query or "")
        found.append(
            Variable(
                name=str(item["name"]),
                query=text or str(item.get("definition", "")),
                regex=str(item.get("regex") or ""),
                multi=bool(item.get("multi")),
                include_all=bool(item.get("includeAll")),
                all_value=item.get("allValue"),
            )
        )
    return found


# --- template variables (frontend) ------------------------------------------------------------


def regular_escape(value: str) -> str:
    """prometheusRegularEscape (the classic behaviour: no feature toggle)."""
    return value.replace("\\", "\\\\").replace("'", "\\\\'")


def special_regex_escape(value: str) -> str:
    """prometheusSpecialRegexEscape (classic behaviour)."""
    value = value.replace("\\", "\\\\\\\\")
    return _REGEX_META.sub(lambda m: "\\\\" + m.group(0), value)


def format_value(value: str | Sequence[str], variable: Variable) -> str:
    """interpolateQueryExpr: how a variable's value enters a PromQL expression."""
    if not variable.multi and not variable.include_all:
        return regular_escape(value if isinstance(value, str) else ",".join(value))
    if isinstance(value, str):
        return special_regex_escape(value)
    escaped = [special_regex_escape(v) for v in value]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def interpolate_variables(
    text: str, variables: Mapping[str, Variable], values: Mapping[str, str | Sequence[str]]
) -> str:
    """The template service's ``replace`` with the Prometheus formatter; built-ins
    (``$__interval``...) and unknown names are left for the backend, as Grafana does.
    ``values[name]`` is the chosen value(s), ``ALL`` for "All"."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2) or match.group(4)
        variable = variables.get(name)
        if variable is None or name not in values:
            return match.group(0)
        value = values[name]
        if variable.include_all and (value == ALL or list(value) == [ALL]):
            if variable.all_value is not None:
                return variable.all_value  # a custom all value goes in as it is
            raise ValueError(f"${name}: All without allValue needs the option list")
        return format_value(value, variable)

    return _VARIABLE.sub(one, text)


# --- step, interval and built-in variables (backend) --------------------------------------------


@dataclass(frozen=True, slots=True)
class GrafanaTime:
    """A dashboard's time range and display: what Grafana's step depends on."""

    start_ms: int
    end_ms: int
    max_data_points: int = 1_000
    """The panel's width in pixels unless the panel sets maxDataPoints."""
    scrape_interval: str = DEFAULT_SCRAPE_INTERVAL
    """The data source's ``timeInterval`` (its scrape interval)."""

    @property
    def range_ms(self) -> int:
        return self.end_ms - self.start_ms


def frontend_interval_ms(time: GrafanaTime, max_data_points: int, min_interval: str) -> int:
    """rangeutil.calculateInterval as the panel query runner calls it: the request's
    ``intervalMs`` (the lower limit is the panel's min interval, else ``timeInterval``)."""
    low = parse_duration_ms(min_interval or time.scrape_interval)
    return max(round_interval_ms(time.range_ms / max_data_points), low)


def backend_step_ms(
    time: GrafanaTime, *, interval_ms: int, max_data_points: int, target: PanelTarget
) -> int:
    """calculatePrometheusInterval: the query's step."""
    variable_interval = target.interval.startswith("$")
    minimum = interval_ms if (not target.interval or variable_interval) else None
    if minimum is None:
        minimum = parse_duration_ms(target.interval)
    resolution = max_data_points or DEFAULT_RESOLUTION
    raw = time.range_ms / resolution
    calculated = minimum if raw < minimum else round_interval_ms(raw)
    adjusted = max(calculated, round_interval_ms(time.range_ms / SAFE_RESOLUTION))
    if target.interval in ("$__rate_interval", "${__rate_interval}"):
        return rate_interval_ms(adjusted, time.scrape_interval)
    return adjusted * target.interval_factor


def rate_interval_ms(query_interval_ms: int, scrape: str) -> int:
    """calculateRateInterval: max(interval + scrape, 4 * scrape)."""
    scrape_ms = parse_duration_ms(scrape or DEFAULT_SCRAPE_INTERVAL)
    return max(query_interval_ms + scrape_ms, 4 * scrape_ms)


def interpolate_builtins(
    expr: str, *, step_ms: int, interval_ms: int, range_ms: int, min_step: str, scrape: str
) -> str:
    """InterpolateVariables, in its order (``_ms`` forms before their prefixes)."""
    if min_step in ("$__rate_interval", "${__rate_interval}"):
        rate = step_ms
    else:
        if min_step in ("$__interval", "${__interval}"):
            min_step = go_duration(step_ms)
        rate = rate_interval_ms(interval_ms, min_step or scrape)
    range_s = math.floor(range_ms / 1000 + 0.5)
    for braces in (False, True):

        def name(n: str, braces: bool = braces) -> str:
            return "${" + n + "}" if braces else "$" + n

        expr = expr.replace(name("__interval_ms"), str(step_ms))
        expr = expr.replace(name("__interval"), format_interval(step_ms))
        expr = expr.replace(name("__range_ms"), str(range_ms))
        expr = expr.replace(name("__range_s"), str(range_s))
        expr = expr.replace(name("__range"), f"{range_s}s")
        expr = expr.replace(name("__rate_interval_ms"), str(rate))
        expr = expr.replace(name("__rate_interval"), go_duration(rate))
    return expr


# --- the requests ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PanelRequest:
    """One Prometheus API request for one panel target, as Grafana's backend sends it."""

    panel_title: str
    ref_id: str
    expr: str
    start_s: float
    end_s: float
    step_s: float | None
    """``None``: an instant query at ``end_s``."""

    @property
    def path(self) -> str:
        return "/api/v1/query" if self.step_s is None else "/api/v1/query_range"

    def params(self) -> dict[str, str]:
        if self.step_s is None:
            return {"query": self.expr, "time": _seconds(self.end_s)}
        return {
            "query": self.expr,
            "start": _seconds(self.start_s),
            "end": _seconds(self.end_s),
            "step": _seconds(self.step_s),
        }


def _seconds(value: float) -> str:
    """strconv.FormatFloat(v, 'f', -1, 64): the shortest decimal."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def panel_request(
    target: PanelTarget,
    time: GrafanaTime,
    variables: Mapping[str, Variable],
    values: Mapping[str, str | Sequence[str]],
) -> PanelRequest:
    max_points = target.max_data_points or time.max_data_points
    interval_ms = frontend_interval_ms(time, max_points, target.interval)
    step_ms = backend_step_ms(
        time, interval_ms=interval_ms, max_data_points=max_points, target=target
    )
    expr = interpolate_variables(target.expr, variables, values)
    expr = interpolate_builtins(
        expr,
        step_ms=step_ms,
        interval_ms=interval_ms,
        range_ms=time.range_ms,
        min_step=target.interval,
        scrape=time.scrape_interval,
    )
    if target.instant:
        return PanelRequest(
            target.panel_title, target.ref_id, expr, time.start_ms / 1000, time.end_ms / 1000, None
        )
    start = (time.start_ms // step_ms) * step_ms  # AlignTimeRange, UTC
    end = (time.end_ms // step_ms) * step_ms
    return PanelRequest(
        target.panel_title, target.ref_id, expr, start / 1000, end / 1000, step_ms / 1000
    )


def panel_requests(
    dashboard: Mapping[str, Any], time: GrafanaTime, values: Mapping[str, str | Sequence[str]]
) -> list[PanelRequest]:
    """Every panel target's request with ``values`` for the template variables."""
    variables = {v.name: v for v in template_variables(dashboard)}
    return [panel_request(t, time, variables, values) for t in panel_targets(dashboard)]


@dataclass(frozen=True, slots=True)
class VariableRequest:
    """The request behind a query variable, and what the browser does with the answer."""

    variable: Variable
    path: str
    params: dict[str, str]
    name_regex: str | None = None
    """``metrics(regex)``: names are kept when this matches them (JavaScript ``test``)."""

    def options(self, data: Sequence[str]) -> list[str]:
        """The variable's options from the answer's ``data`` (its regex applied)."""
        names = [d for d in data if self.name_regex is None or re.search(self.name_regex, d)]
        if not self.variable.regex:
            return names
        pattern = re.compile(self.variable.regex.strip("/"))
        kept = []
        for name in names:
            if found := pattern.search(name):
                kept.append(found.group(1) if found.groups() else name)
        return kept


def variable_request(
    variable: Variable,
    time: GrafanaTime,
    variables: Mapping[str, Variable],
    values: Mapping[str, str | Sequence[str]],
) -> VariableRequest:
    """metricFindQuery: the query interpolated with the values chosen so far."""
    query = interpolate_variables(variable.query, variables, values)
    span = {
        "start": str(math.ceil(time.start_ms / 1000)),
        "end": str(math.ceil(time.end_ms / 1000)),
    }
    if found := _LABEL_VALUES.match(query):
        selector, label = found.group(1), found.group(2)
        params = dict(span)
        if selector and selector.replace(" ", "") != "{}":
            params = {"match[]": selector, **span}
        return VariableRequest(variable, f"/api/v1/label/{label}/values", params)
    if found := _METRICS.match(query):
        return VariableRequest(variable, "/api/v1/label/__name__/values", span, found.group(1))
    raise ValueError(f"${variable.name}: a query form this harness does not model: {query!r}")
