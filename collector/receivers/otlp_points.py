"""OTLP metrics → points: the documented mapping of every OTLP metric kind (pure code).

Labels of a point: the resource's attributes, then ``otel.scope.name`` /
``otel.scope.version`` (when set), then the data point's attributes (a later one wins
on a name clash). Attribute values become text: strings as they are, booleans
``true``/``false``, numbers in decimal, bytes in base64, arrays and key-value lists as
compact JSON. Timestamps are ``time_unix_nano``.

| OTLP kind | points (one data point → these rows) |
|---|---|
| Gauge | ``<name>`` = the value |
| Sum | ``<name>`` = the value, labels ``otel.temporality`` (``cumulative``/``delta``) and ``otel.monotonic`` (``true``/``false``) |
| Histogram | ``<name>_count``, ``<name>_sum`` (if set), ``<name>_min``/``_max`` (if set), and ``<name>_bucket`` with label ``le`` per bucket, cumulative counts, the last ``le="+Inf"`` (Prometheus style); all with ``otel.temporality`` |
| Summary | ``<name>_count``, ``<name>_sum``, and ``<name>`` with label ``quantile`` per quantile |
| ExponentialHistogram | refused (``partial_success``): not supported |

``otel.*`` attribute names are reserved by OpenTelemetry, so the labels added here do
not collide with user attributes (if a sender uses them anyway, ours win).

Refused data points (counted per data point, not per row, in ``partial_success``): a
sum or histogram without an aggregation temporality, a number point without a value,
``time_unix_nano`` 0 or past 2^63-1 ns, a histogram whose ``bucket_counts`` do not
match ``explicit_bounds``, and any row a frame could not carry (PROTOCOL §1: a metric
name the kind maps to over 256 bytes — every data point of that metric —, more than 64
attributes on the data point, as sent, or more than 64 labels in all, a label key or
value over its size). Data points flagged "no recorded value" are left out (counted as
dropped). Integer values become float64 (exact up to 2^53).

Work is bounded before it is done, whatever the request holds:

- `count_request` walks resources, scopes and metrics, never a data point, and counts
  every data point (refused ones included): more than ``max_points`` of them, or more
  resources, scopes and metrics together than that, is 413 before any point is read.
  It stops counting at the limit.
- A resource or scope whose labels break a §1 rule (more than 64 attributes, counted as
  sent and not read; a key or value over its size) refuses the whole request with 400
  naming it: none of its points could be stored, and refusing them one by one would
  cost the attributes times the points.
- The labels of a (resource, scope) are built and checked once. A data point adds its
  own attributes (more than 64 refuse it unread), checked alone; the rows of a
  histogram or summary are counted against ``max_points`` before they are built.

So a request reads at most 64 attributes per resource, scope and data point, and
builds at most ``max_points`` rows.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AggregationTemporality,
    DataPointFlags,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    SummaryDataPoint,
)

from protocol.frame import MAX_LABELS_PER_ROW

from .frames import TS_NS_MAX, labels_problem, metric_problem
from .intake import Decoded, TooLarge, WireError, too_many_points

TEMPORALITY_LABEL = "otel.temporality"
MONOTONIC_LABEL = "otel.monotonic"
_TEMPORALITIES = {
    AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE: "cumulative",
    AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA: "delta",
}
_NO_RECORDED_VALUE = DataPointFlags.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
_SUFFIXES = {  # the metric names each kind maps to
    "gauge": ("",),
    "sum": ("",),
    "histogram": ("_count", "_sum", "_min", "_max", "_bucket"),
    "summary": ("_count", "_sum", ""),
}
Row = tuple[str, float, dict[str, str]]  # metric, value, labels


def request_points(request: ExportMetricsServiceRequest, max_points: int) -> Decoded:
    """Map every data point of ``request`` (see the module docstring). Raises
    `collector.receivers.intake.TooLarge` past ``max_points`` and `WireError` for a
    resource or scope whose labels no point could carry."""
    count_request(request, max_points)
    mapper = _Mapper(max_points)
    for r_index, resource_metrics in enumerate(request.resource_metrics):
        where = f"resource_metrics[{r_index}].resource"
        resource = base_labels(resource_metrics.resource.attributes, {}, where)
        for s_index, scope_metrics in enumerate(resource_metrics.scope_metrics):
            scope_labels = {}
            if scope_metrics.scope.name:
                scope_labels["otel.scope.name"] = scope_metrics.scope.name
            if scope_metrics.scope.version:
                scope_labels["otel.scope.version"] = scope_metrics.scope.version
            where = f"resource_metrics[{r_index}].scope_metrics[{s_index}].scope"
            scope = (
                base_labels((), {**resource, **scope_labels}, where) if scope_labels else resource
            )
            for metric in scope_metrics.metrics:
                mapper.metric(metric, scope)
    return mapper.decoded


def count_request(request: ExportMetricsServiceRequest, max_points: int) -> None:
    """Raise `TooLarge` when ``request`` carries more than ``max_points`` data points, or
    more than ``max_points`` resources, scopes and metrics together; reads no data point
    and stops at the limit."""
    points = parts = 0
    for resource_metrics in request.resource_metrics:
        parts += 1 + len(resource_metrics.scope_metrics)
        for scope_metrics in resource_metrics.scope_metrics:
            parts += len(scope_metrics.metrics)
            if parts > max_points:
                break
            for metric in scope_metrics.metrics:
                kind = metric.WhichOneof("data")
                if kind is not None:
                    points += len(getattr(metric, kind).data_points)
            if points > max_points:
                raise TooLarge(
                    "too_many_points",
                    f"the request carries at least {points} data points (refused ones "
                    f"included) > receivers.max_points_per_request {max_points}",
                    max_points,
                )
        if parts > max_points:
            raise TooLarge(
                "too_many_points",
                f"the request has more than {max_points} resources, scopes and metrics "
                f"(receivers.max_points_per_request {max_points})",
                max_points,
            )


def base_labels(attributes: Sequence[KeyValue], base: dict[str, str], where: str) -> dict[str, str]:
    """``base`` with ``attributes`` (later wins), checked by the §1 label rules; raises
    `WireError` naming ``where``. More than 64 attributes are refused unread."""
    if len(attributes) > MAX_LABELS_PER_ROW:
        raise WireError(
            f"{where} has {len(attributes)} attributes: more than the {MAX_LABELS_PER_ROW} "
            "labels a point may carry (PROTOCOL §1), so none of its points can be stored"
        )
    labels = {**base, **attribute_labels(attributes)} if attributes else dict(base)
    problem = labels_problem(labels)
    if problem is not None:
        raise WireError(f"{where}: {problem}, so none of its points can be stored")
    return labels


class _Mapper:
    def __init__(self, max_points: int) -> None:
        self.decoded = Decoded()
        self.max_points = max_points

    def metric(self, metric: Metric, base: dict[str, str]) -> None:
        kind = metric.WhichOneof("data")
        if kind is None:
            return
        name = metric.name
        if kind == "exponential_histogram":
            count = len(metric.exponential_histogram.data_points)
            self._reject("exponential histograms are not supported", count)
            return
        data = getattr(metric, kind)
        for suffix in _SUFFIXES[kind]:
            problem = metric_problem(name + suffix)
            if problem is not None:
                self._reject(problem, len(data.data_points))
                return
        if kind == "gauge":
            plain = base
            for point in metric.gauge.data_points:
                self._number(name, point, base, plain, {})
        elif kind in ("sum", "histogram"):
            text = _TEMPORALITIES.get(data.aggregation_temporality)
            if text is None:
                self._reject(
                    f"{name}: aggregation temporality is unspecified", len(data.data_points)
                )
                return
            extra = {TEMPORALITY_LABEL: text}
            if kind == "sum":
                extra = {MONOTONIC_LABEL: "true" if data.is_monotonic else "false", **extra}
            plain = {**base, **extra}
            self._temporal(name, data.data_points, base, plain, extra)
        else:
            for summary in metric.summary.data_points:
                self._summary(name, summary, base)

    def _temporal(
        self,
        name: str,
        points: Sequence[NumberDataPoint] | Sequence[HistogramDataPoint],
        base: dict[str, str],
        plain: dict[str, str],
        extra: dict[str, str],
    ) -> None:
        for point in points:
            if isinstance(point, NumberDataPoint):
                self._number(name, point, base, plain, extra)
            else:
                self._histogram(name, point, base, plain, extra)

    def _labels(
        self,
        name: str,
        attributes: Sequence[KeyValue],
        base: dict[str, str],
        plain: dict[str, str],
        extra: dict[str, str],
        row_label: str | None = None,
    ) -> dict[str, str] | None:
        """The point's labels: ``plain`` (base + extra, built once per metric) when it
        has no attributes, else base + its attributes + extra; None (refused, counted)
        when they, with ``row_label`` (``le``, ``quantile``) added, break a §1 rule."""
        if not attributes:
            labels = plain
        elif len(attributes) > MAX_LABELS_PER_ROW:
            self._reject(f"{name}: {len(attributes)} attributes (max {MAX_LABELS_PER_ROW})")
            return None
        else:
            own = attribute_labels(attributes)
            problem = labels_problem(own)
            if problem is not None:
                self._reject(f"{name}: {problem}")
                return None
            labels = {**base, **own, **extra}
        total = len(labels) + (row_label is not None and row_label not in labels)
        if total > MAX_LABELS_PER_ROW:
            self._reject(f"{name}: {total} labels (max {MAX_LABELS_PER_ROW})")
            return None
        return labels

    def _number(
        self,
        name: str,
        point: NumberDataPoint,
        base: dict[str, str],
        plain: dict[str, str],
        extra: dict[str, str],
    ) -> None:
        if not self._usable(name, point.flags, point.time_unix_nano):
            return
        which = point.WhichOneof("value")
        if which is None:
            self._reject(f"{name}: number data point without a value")
            return
        value = float(point.as_double if which == "as_double" else point.as_int)
        labels = self._labels(name, point.attributes, base, plain, extra)
        if labels is not None:
            self._emit(point.time_unix_nano, [(name, value, labels)])

    def _histogram(
        self,
        name: str,
        point: HistogramDataPoint,
        base: dict[str, str],
        plain: dict[str, str],
        extra: dict[str, str],
    ) -> None:
        if not self._usable(name, point.flags, point.time_unix_nano):
            return
        bounds, counts = point.explicit_bounds, point.bucket_counts
        if counts and len(counts) != len(bounds) + 1:
            self._reject(f"{name}: {len(counts)} bucket_counts for {len(bounds)} explicit_bounds")
            return
        self._room(4 + len(counts))
        row_label = "le" if counts else None
        labels = self._labels(name, point.attributes, base, plain, extra, row_label)
        if labels is None:
            return
        rows: list[Row] = [(f"{name}_count", float(point.count), labels)]
        for field in ("sum", "min", "max"):
            if point.HasField(field):
                rows.append((f"{name}_{field}", float(getattr(point, field)), labels))
        cumulative = 0
        for index, count in enumerate(counts):
            cumulative += count
            le = bound_text(bounds[index]) if index < len(bounds) else "+Inf"
            rows.append((f"{name}_bucket", float(cumulative), {**labels, "le": le}))
        self._emit(point.time_unix_nano, rows)

    def _summary(self, name: str, point: SummaryDataPoint, base: dict[str, str]) -> None:
        if not self._usable(name, point.flags, point.time_unix_nano):
            return
        quantiles = point.quantile_values
        self._room(2 + len(quantiles))
        row_label = "quantile" if quantiles else None
        labels = self._labels(name, point.attributes, base, base, {}, row_label)
        if labels is None:
            return
        rows: list[Row] = [
            (f"{name}_count", float(point.count), labels),
            (f"{name}_sum", float(point.sum), labels),
        ]
        for quantile in quantiles:
            q = bound_text(quantile.quantile)
            rows.append((name, float(quantile.value), {**labels, "quantile": q}))
        self._emit(point.time_unix_nano, rows)

    def _usable(self, name: str, flags: int, time_unix_nano: int) -> bool:
        """False (dropped or refused, counted) for a point flagged "no recorded value" or
        with an unusable time."""
        if flags & _NO_RECORDED_VALUE:
            self.decoded.dropped["no_recorded_value"] += 1
            return False
        if time_unix_nano == 0 or time_unix_nano > TS_NS_MAX:
            self._reject(f"{name}: time_unix_nano {time_unix_nano} is not a usable time")
            return False
        return True

    def _room(self, rows: int) -> None:
        """Raise `TooLarge` when ``rows`` more rows would pass ``max_points``."""
        held = len(self.decoded.rows)
        if held + rows > self.max_points:
            raise too_many_points(held + rows, self.max_points)

    def _emit(self, time_unix_nano: int, rows: list[Row]) -> None:
        """Add one data point's rows (checked)."""
        self._room(len(rows))
        out = self.decoded.rows
        for metric, value, labels in rows:
            out.append(time_unix_nano, metric, value, labels)

    def _reject(self, reason: str, count: int = 1) -> None:
        if count:
            self.decoded.rejected[reason] += count


def attribute_labels(attributes: Iterable[KeyValue]) -> dict[str, str]:
    """OTLP attributes → label text (a later duplicate key wins)."""
    return {attribute.key: any_value_text(attribute.value) for attribute in attributes}


def any_value_text(value: AnyValue) -> str:
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which is None:
        return ""
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return json.dumps(_plain(value), separators=(",", ":"), ensure_ascii=False)


def _plain(value: AnyValue) -> Any:
    """An AnyValue as plain JSON data (strings as strings, bytes as base64)."""
    which = value.WhichOneof("value")
    if which == "bool_value":
        return value.bool_value
    if which == "int_value":
        return value.int_value
    if which == "double_value":
        return value.double_value
    if which == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    if which == "array_value":
        return [_plain(item) for item in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _plain(kv.value) for kv in value.kvlist_value.values}
    if which == "string_value":
        return value.string_value
    return None


def bound_text(value: float) -> str:
    """A bucket bound or quantile as Prometheus writes it: ``1``, ``2.5``, ``+Inf``."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    return text[:-2] if text.endswith(".0") else text
