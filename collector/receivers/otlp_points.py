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
match ``explicit_bounds``, and any row a frame could not carry (`frames.point_problem`:
a name or label over the PROTOCOL §1 limits, more than 64 labels, ...). Data points
flagged "no recorded value" are left out (counted as dropped), as staleness markers
are. Integer values become float64 (exact up to 2^53).
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

from .frames import TS_NS_MAX, point_problem
from .intake import Decoded, too_many_points

TEMPORALITY_LABEL = "otel.temporality"
MONOTONIC_LABEL = "otel.monotonic"
_TEMPORALITIES = {
    AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE: "cumulative",
    AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA: "delta",
}
_NO_RECORDED_VALUE = DataPointFlags.DATA_POINT_FLAGS_NO_RECORDED_VALUE_MASK
Row = tuple[str, float, dict[str, str]]  # metric, value, labels


def request_points(request: ExportMetricsServiceRequest, max_points: int) -> Decoded:
    """Map every data point of ``request`` (see the module docstring). Raises
    `collector.receivers.intake.TooLarge` past ``max_points`` rows."""
    mapper = _Mapper(max_points)
    for resource_metrics in request.resource_metrics:
        resource = attribute_labels(resource_metrics.resource.attributes)
        for scope_metrics in resource_metrics.scope_metrics:
            scope = dict(resource)
            if scope_metrics.scope.name:
                scope["otel.scope.name"] = scope_metrics.scope.name
            if scope_metrics.scope.version:
                scope["otel.scope.version"] = scope_metrics.scope.version
            for metric in scope_metrics.metrics:
                mapper.metric(metric, scope)
    return mapper.decoded


class _Mapper:
    def __init__(self, max_points: int) -> None:
        self.decoded = Decoded()
        self.max_points = max_points

    def metric(self, metric: Metric, base: dict[str, str]) -> None:
        kind = metric.WhichOneof("data")
        name = metric.name
        if kind == "gauge":
            for point in metric.gauge.data_points:
                self._number(name, point, base, {})
        elif kind == "sum":
            extra = {MONOTONIC_LABEL: "true" if metric.sum.is_monotonic else "false"}
            self._temporal(
                name, metric.sum.aggregation_temporality, metric.sum.data_points, base, extra
            )
        elif kind == "histogram":
            hist = metric.histogram
            self._temporal(name, hist.aggregation_temporality, hist.data_points, base, {})
        elif kind == "summary":
            for summary in metric.summary.data_points:
                self._summary(name, summary, base)
        elif kind == "exponential_histogram":
            count = len(metric.exponential_histogram.data_points)
            self._reject("exponential histograms are not supported", count)

    def _temporal(
        self,
        name: str,
        temporality: int,
        points: Sequence[NumberDataPoint] | Sequence[HistogramDataPoint],
        base: dict[str, str],
        extra: dict[str, str],
    ) -> None:
        text = _TEMPORALITIES.get(temporality)  # type: ignore[call-overload]
        if text is None:
            self._reject(f"{name}: aggregation temporality is unspecified", len(points))
            return
        extra = {**extra, TEMPORALITY_LABEL: text}
        for point in points:
            if isinstance(point, NumberDataPoint):
                self._number(name, point, base, extra)
            else:
                self._histogram(name, point, base, extra)

    def _number(
        self, name: str, point: NumberDataPoint, base: dict[str, str], extra: dict[str, str]
    ) -> None:
        if not self._recorded(point.flags):
            return
        which = point.WhichOneof("value")
        if which is None:
            self._reject(f"{name}: number data point without a value")
            return
        value = float(point.as_double if which == "as_double" else point.as_int)
        labels = _labels(base, point.attributes, extra)
        self._emit(name, point.time_unix_nano, [(name, value, labels)])

    def _histogram(
        self, name: str, point: HistogramDataPoint, base: dict[str, str], extra: dict[str, str]
    ) -> None:
        if not self._recorded(point.flags):
            return
        bounds, counts = point.explicit_bounds, point.bucket_counts
        if counts and len(counts) != len(bounds) + 1:
            self._reject(f"{name}: {len(counts)} bucket_counts for {len(bounds)} explicit_bounds")
            return
        labels = _labels(base, point.attributes, extra)
        rows: list[Row] = [(f"{name}_count", float(point.count), labels)]
        for field in ("sum", "min", "max"):
            if point.HasField(field):
                rows.append((f"{name}_{field}", float(getattr(point, field)), labels))
        cumulative = 0
        for index, count in enumerate(counts):
            cumulative += count
            le = bound_text(bounds[index]) if index < len(bounds) else "+Inf"
            rows.append((f"{name}_bucket", float(cumulative), {**labels, "le": le}))
        self._emit(name, point.time_unix_nano, rows)

    def _summary(self, name: str, point: SummaryDataPoint, base: dict[str, str]) -> None:
        if not self._recorded(point.flags):
            return
        labels = _labels(base, point.attributes, {})
        rows: list[Row] = [
            (f"{name}_count", float(point.count), labels),
            (f"{name}_sum", float(point.sum), labels),
        ]
        for quantile in point.quantile_values:
            q = bound_text(quantile.quantile)
            rows.append((name, float(quantile.value), {**labels, "quantile": q}))
        self._emit(name, point.time_unix_nano, rows)

    def _emit(self, name: str, time_unix_nano: int, rows: list[Row]) -> None:
        """Add one data point's rows, or refuse the whole data point."""
        if time_unix_nano == 0 or time_unix_nano > TS_NS_MAX:
            self._reject(f"{name}: time_unix_nano {time_unix_nano} is not a usable time")
            return
        for metric, _value, labels in rows:
            problem = point_problem(time_unix_nano, metric, labels)
            if problem is not None:
                self._reject(f"{metric}: {problem}")
                return
        out = self.decoded.rows
        if len(out) + len(rows) > self.max_points:
            raise too_many_points(len(out) + len(rows), self.max_points)
        for metric, value, labels in rows:
            out.append(time_unix_nano, metric, value, labels)

    def _recorded(self, flags: int) -> bool:
        if flags & _NO_RECORDED_VALUE:
            self.decoded.dropped["no_recorded_value"] += 1
            return False
        return True

    def _reject(self, reason: str, count: int = 1) -> None:
        if count:
            self.decoded.rejected[reason] += count


def _labels(
    base: dict[str, str], attributes: Iterable[KeyValue], extra: dict[str, str]
) -> dict[str, str]:
    labels = dict(base)
    labels.update(attribute_labels(attributes))
    labels.update(extra)
    return labels


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
