"""The differential test's PromQL expressions (issue 32), each with its category.

Every expression runs as an instant query at each of `INSTANT_TIMES` and as one range
query (`RANGE`), on the reference and on ours. Every one except ``absent*`` returns at
least one series with a value that is not NaN on the reference
(tests/collector/promql/diff/test_reference.py checks exactly that). Expressions that
evaluate to a range vector (``x[5m]``) run as instant queries only: a range query of
one is an error on any Prometheus.

The fleet is tests/collector/promql/diff/fleet.py; its names are the presented ones
(``http_server_duration`` is the stored ``http.server.duration``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.collector.promql.diff.fleet import END_MS, T0_MS


@dataclass(frozen=True)
class Query:
    category: str
    expr: str
    instant_only: bool = False


def _s(ms: int) -> str:
    whole, rest = divmod(ms, 1000)
    return f"{whole}.{rest:03d}" if rest else str(whole)


MIN = 60_000
INSTANT_TIMES = (
    _s(T0_MS + 47 * MIN + 13_000),  # 10:47:13, inside hour one
    _s(T0_MS + 89 * MIN + 41_500),  # 11:29:41.5, inside hour two
    _s(END_MS + 3 * MIN),  # 12:03:00, after the end: lookback and staleness
)
RANGE = {"start": _s(T0_MS + 3 * MIN + 30_000), "end": _s(END_MS + 5 * MIN), "step": "45"}

RATE = "rate(http_requests_total[5m])"
BUCKETS = "rate(request_duration_seconds_bucket[5m])"

_SELECTORS = [
    "http_requests_total",
    'http_requests_total{code="500"}',
    'http_requests_total{code!="500"}',
    'http_requests_total{instance=~"i[01]"}',
    'http_requests_total{instance!~"i[01]"}',
    'http_requests_total{method="GET",code=~"2.."}',
    'http_requests_total{job="api",instance!="i0",code!~"5.*"}',
    '{__name__=~"rpc_latency_seconds.*"}',
    '{__name__=~"http_.*",job="api"}',
    '{__name__="node_memory_bytes"}',
    '{__name__!~"http.*|rpc.*|request.*",__name__=~".+"}',
    'cpu_usage_ratio{dc=""}',
    'node_memory_bytes{dc!=""}',
    'cpu_usage_ratio{mode=~"user|system",instance!~"i2"}',
    'http_server_duration{service_name="checkout"}',
    'http_server_duration{http_method!="GET"}',
    "batch_progress",
    'batch_items_total{worker=~"w.*"}',
    'request_duration_seconds_bucket{le="+Inf"}',
    r'request_duration_seconds_bucket{le=~"0\\.1|1"}',
    'rpc_latency_seconds{quantile!="0.5"}',
    'node_memory_bytes{instance=~".+"}',
]
_RANGE_SELECTORS = [
    'http_requests_total{code="500"}[2m]',
    "batch_progress[1m]",
    "http_server_duration[90s]",
    'request_duration_seconds_bucket{instance="i1"}[1m]',
]
_RATES = [
    *(f"{fn}(http_requests_total[{w}])" for fn in ("rate", "irate", "increase") for w in ("1m", "5m")),
    'rate(http_requests_total{code="500"}[10m])',
    "increase(http_requests_total[1h])",
    "rate(http_server_duration[5m])",
    "increase(http_server_duration[10m])",
    "rate(batch_items_total[5m])",
    "irate(batch_items_total[2m])",
    "rate(request_duration_seconds_count[5m])",
    "rate(rpc_latency_seconds_count[3m])",
    *(f"{fn}({g}[{w}])" for fn in ("delta", "deriv") for g in ("node_memory_bytes", "cpu_usage_ratio") for w in ("5m", "15m")),
    "delta(batch_progress[10m])",
    "deriv(batch_progress[5m])",
    "idelta(cpu_usage_ratio[1m])",
    "resets(http_requests_total[1h])",
    "resets(http_server_duration[2h])",
    "resets(batch_items_total[30m])",
    "changes(batch_progress[5m])",
    "changes(node_memory_bytes[10m])",
    "changes(http_requests_total[3m])",
]  # fmt: skip
_OVER_TIME_FNS = ("avg", "min", "max", "sum", "count", "stddev", "stdvar", "last", "present")
_OVER_TIME = [
    *(f"{fn}_over_time({s})" for fn in _OVER_TIME_FNS for s in ("cpu_usage_ratio[5m]", "node_memory_bytes[30m]", "batch_progress[10m]")),
    "quantile_over_time(0.9, cpu_usage_ratio[10m])",
    "quantile_over_time(0.5, batch_progress[5m])",
    "max_over_time(http_server_duration[1h])",
]  # fmt: skip
_AGG_OPS = ("sum", "avg", "min", "max", "count", "stddev", "stdvar", "group")
_AGGREGATIONS = [
    *(f"{op} by (instance) ({RATE})" for op in _AGG_OPS),
    *(f"{op} without (method) ({RATE})" for op in _AGG_OPS),
    *(f"{op}(cpu_usage_ratio)" for op in _AGG_OPS),
    f"topk(2, {RATE})",
    "topk by (instance) (1, http_requests_total)",
    f"topk without (code) (1, {RATE})",
    f"bottomk(3, {RATE})",
    "bottomk by (dc) (1, node_memory_bytes)",
    "bottomk without (mode) (1, cpu_usage_ratio)",
    "quantile(0.9, cpu_usage_ratio)",
    f"quantile by (instance) (0.5, {RATE})",
    f"quantile without (method, code) (0.99, {RATE})",
    'count_values("v", round(cpu_usage_ratio * 10))',
    'count_values by (instance) ("v", round(cpu_usage_ratio * 10))',
    'count_values without (mode) ("v", round(cpu_usage_ratio * 10))',
    'count_values by (le) ("count", request_duration_seconds_bucket > bool 0)',
    "sum by (service_name, http_method) (rate(http_server_duration[5m]))",
    "sum(batch_progress)",
    'count by (__name__) ({__name__=~"batch.*"})',
]
_HISTOGRAMS = [
    *(f"histogram_quantile({q}, {BUCKETS})" for q in ("0.5", "0.9", "0.99")),
    *(f"histogram_quantile({q}, sum by (le) ({BUCKETS}))" for q in ("0.5", "0.95")),
    f"histogram_quantile(0.75, sum by (le, instance) ({BUCKETS}))",
    "histogram_quantile(0.9, sum without (instance) (rate(request_duration_seconds_bucket[10m])))",
    "histogram_quantile(0.5, sum by (le) (increase(request_duration_seconds_bucket[1h])))",
    "histogram_quantile(0.9, request_duration_seconds_bucket)",
    'rpc_latency_seconds{quantile="0.99"}',
    "avg by (quantile) (rpc_latency_seconds)",
    "max without (service) (rpc_latency_seconds)",
    "rate(rpc_latency_seconds_sum[5m]) / rate(rpc_latency_seconds_count[5m])",
    "rate(request_duration_seconds_sum[5m]) / rate(request_duration_seconds_count[5m])",
    "sum(rate(request_duration_seconds_sum[10m])) / sum(rate(request_duration_seconds_count[10m]))",
]
_500, _200 = (
    'rate(http_requests_total{code="500"}[5m])',
    'rate(http_requests_total{code="200"}[5m])',
)
_BINARY = [
    "http_requests_total + 1",
    "node_memory_bytes / 1024 / 1024",
    "2 * cpu_usage_ratio",
    "cpu_usage_ratio - 0.5",
    "http_requests_total % 7",
    "cpu_usage_ratio ^ 2",
    "-cpu_usage_ratio",
    f"{_500} / ignoring(code) {_200}",
    f"{_500} / on(instance, method) {_200}",
    f"{RATE} / on(instance) group_left sum by (instance) ({RATE})",
    f"{RATE} / ignoring(method, code) group_left sum without (method, code) ({RATE})",
    "cpu_usage_ratio * on(instance) group_left(dc) (node_memory_bytes * 0 + 1)",
    "sum by (instance) (cpu_usage_ratio) * on(instance) group_right cpu_usage_ratio",
    "node_memory_bytes - on(instance) group_left sum by (instance) (cpu_usage_ratio)",
    "cpu_usage_ratio > 0.3",
    "cpu_usage_ratio > bool 0.3",
    "node_memory_bytes < bool 4e9",
    "http_requests_total >= 100",
    f"{RATE} == bool 0",
    "cpu_usage_ratio != bool 0.5",
    "cpu_usage_ratio <= 0.35",
    "0.3 < cpu_usage_ratio",
    'cpu_usage_ratio{mode="user"} > ignoring(mode) cpu_usage_ratio{mode="system"}',
    'cpu_usage_ratio{mode="user"} > bool ignoring(mode) cpu_usage_ratio{mode="system"}',
    f"sum by (instance) ({RATE}) > bool on(instance) sum by (instance) ({_500})",
    'http_requests_total and http_requests_total{code="500"}',
    "cpu_usage_ratio or node_memory_bytes",
    'http_requests_total unless http_requests_total{method="GET"}',
    "batch_progress unless on(worker) batch_items_total",
    "batch_progress and on(worker) batch_items_total",
    "sum(cpu_usage_ratio) / count(cpu_usage_ratio)",
    "scalar(sum(cpu_usage_ratio)) * node_memory_bytes",
]
_OFFSETS = [
    "http_requests_total offset 5m",
    "rate(http_requests_total[5m] offset 10m)",
    "http_requests_total / http_requests_total offset 1h",
    "node_memory_bytes - node_memory_bytes offset 30m",
    "sum(rate(http_requests_total[5m] offset 1h))",
    "avg_over_time(cpu_usage_ratio[10m] offset 20m)",
    "cpu_usage_ratio offset -5m",
    "batch_progress offset 15m",
    f"http_requests_total @ {_s(T0_MS + 50 * MIN)}",
    "rate(http_requests_total[5m] @ start())",
    "http_server_duration offset 1h",
]
_ABSENT = [
    "absent(nonexistent_metric)",
    "absent(http_requests_total)",
    'absent(http_requests_total{code="404"})',
    'absent(nonexistent{job="x",instance="y"})',
    'absent(batch_progress{worker="w0"})',
    'absent(http_server_duration{service_name="nope"})',
    'absent_over_time(batch_progress{worker="w0"}[10m])',
    "absent_over_time(nonexistent_metric[5m])",
    "absent_over_time(http_requests_total[5m])",
    'absent_over_time(batch_items_total{worker="w1"}[1m])',
]
_LABELS = [
    'label_replace(http_requests_total, "inst", "$1", "instance", "i(.*)")',
    f'label_replace({RATE}, "code_class", "${{1}}xx", "code", "(.)..")',
    'label_replace(cpu_usage_ratio, "x", "$1", "instance", "nomatch(.*)")',
    'label_replace(http_server_duration, "svc", "$1", "service_name", "(.*)")',
    'label_replace(node_memory_bytes, "dc", "", "dc", ".*")',
    'label_join(http_requests_total, "id", "-", "instance", "method", "code")',
    'label_join(cpu_usage_ratio, "x", ",", "mode")',
    f'sum by (code_class) (label_replace({RATE}, "code_class", "${{1}}xx", "code", "(.).."))',
]
_MATH_TIME = [
    "clamp(cpu_usage_ratio, 0.25, 0.35)",
    "clamp_min(cpu_usage_ratio, 0.3)",
    "clamp_max(node_memory_bytes, 4e9)",
    "abs(cpu_usage_ratio - 0.3)",
    "abs(delta(node_memory_bytes[5m]))",
    "round(cpu_usage_ratio, 0.1)",
    "round(node_memory_bytes / 1e6)",
    "round(batch_progress, 5)",
    "ceil(cpu_usage_ratio * 10)",
    "floor(batch_progress)",
    "sqrt(node_memory_bytes)",
    "exp(cpu_usage_ratio)",
    "ln(node_memory_bytes)",
    "log2(http_requests_total + 1)",
    "log10(node_memory_bytes)",
    "sgn(delta(node_memory_bytes[5m]))",
    "time()",
    "timestamp(cpu_usage_ratio)",
    "time() - timestamp(batch_progress)",
    "timestamp(http_server_duration)",
    "minute()",
    "hour()",
    "day_of_week()",
    "day_of_month()",
    "days_in_month()",
    "month()",
    "year()",
    "hour(timestamp(node_memory_bytes))",
    "minute(timestamp(batch_items_total))",
    "day_of_year(timestamp(cpu_usage_ratio))",
    "vector(time())",
    "scalar(sum(cpu_usage_ratio))",
    "1 + 1",
    "vector(1) + on() group_left count(cpu_usage_ratio)",
]
_SUBQUERIES = [
    f"max_over_time({RATE}[30m:1m])",
    "avg_over_time(cpu_usage_ratio[10m:30s])",
    "rate(http_requests_total[5m:1m])",
    "max_over_time(deriv(node_memory_bytes[5m])[20m:2m])",
    "min_over_time(sum(rate(http_requests_total[1m]))[15m:])",
    f"quantile_over_time(0.9, histogram_quantile(0.9, sum by (le) ({BUCKETS}))[30m:5m])",
    "count_over_time(batch_progress[20m:1m])",
    "last_over_time(node_memory_bytes[10m:1m] offset 5m)",
    "sum_over_time(increase(http_server_duration[5m])[1h:5m])",
    "stddev_over_time(cpu_usage_ratio[30m:45s])",
    f"max_over_time(sum by (instance) ({RATE})[1h:10m])",
]

QUERIES: tuple[Query, ...] = (
    *(Query("selector", e) for e in _SELECTORS),
    *(Query("selector", e, instant_only=True) for e in _RANGE_SELECTORS),
    *(Query("rate", e) for e in _RATES),
    *(Query("over_time", e) for e in _OVER_TIME),
    *(Query("aggregation", e) for e in _AGGREGATIONS),
    *(Query("histogram", e) for e in _HISTOGRAMS),
    *(Query("binary", e) for e in _BINARY),
    *(Query("offset", e) for e in _OFFSETS),
    *(Query("absent", e) for e in _ABSENT),
    *(Query("label", e) for e in _LABELS),
    *(Query("math_time", e) for e in _MATH_TIME),
    *(Query("subquery", e) for e in _SUBQUERIES),
)
CATEGORIES = tuple(dict.fromkeys(q.category for q in QUERIES))
