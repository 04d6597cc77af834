"""One scrape of one Prometheus text endpoint → a points table (``lm-agent scrape``).

`scrape_target` GETs the target (``Accept: text/plain;version=0.0.4``) within the scrape
timeout, reading at most ``max_bytes`` of body, parses it with
``prometheus_client.parser.text_string_to_metric_families`` in a worker thread and
returns one row per sample plus the three series Prometheus records for every scrape of a
target (so dashboards and alerts written for Prometheus work unchanged): ``up`` (1 on
success), ``scrape_duration_seconds`` (the GET and the parse) and
``scrape_samples_scraped`` (the samples the target exposed; 0 for a failed scrape).
Prometheus's relabelling and series-churn series (``scrape_samples_post_metric_relabeling``,
``scrape_series_added``) are not made: the agent does not relabel or track series. Rows:

- metric: the sample's name (``http_requests_total``, ``latency_bucket``, ...);
- labels: the sample's labels, then the target's labels (``instance`` = the target's
  ``host:port``, plus the configured ones), which win; a scraped label they replace is
  kept as ``exported_<name>``;
- ts: the sample's own timestamp when the exposition carries one, else the time the
  scrape started (milliseconds, as Prometheus records it).

A failed scrape (connection error, non-200, timeout, body over ``max_bytes``, parse
error, or a sample a frame cannot carry) yields only those three series, ``up = 0``, and
the reason.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from protocol.frame import FrameError
from protocol.frame_encode import points_table

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
DURATION = "scrape_duration_seconds"
SAMPLES = "scrape_samples_scraped"


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    labels: dict[str, str]

    @classmethod
    def of(cls, url: str, labels: dict[str, str] | None = None) -> Target:
        """A target whose labels are ``instance`` (host:port of ``url``) and ``labels``."""
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return cls(url, {"instance": f"{parts.hostname}:{port}", **(labels or {})})


@dataclass(frozen=True, slots=True)
class ScrapeResult:
    target: Target
    points: pa.Table  # always at least the rows of ``up`` and the other two report series
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None


class _TooLarge(Exception):
    pass


async def scrape_target(
    session: aiohttp.ClientSession,
    target: Target,
    *,
    started_ns: int,
    timeout_s: float,
    max_bytes: int,
    monotonic: Callable[[], float] = time.monotonic,
) -> ScrapeResult:
    """Scrape ``target`` once (see the module docstring). Never raises for the target's
    failures; they are in `ScrapeResult.error`. ``monotonic`` times the scrape."""
    ts_ms = started_ns // 1_000_000
    began = monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            text = await _fetch(session, target.url, max_bytes)
        table = await asyncio.to_thread(_parse, text, target.labels, ts_ms, began, monotonic)
    except TimeoutError:
        error = f"no answer within {timeout_s:g}s"
    except _TooLarge:
        error = f"body larger than {max_bytes} bytes"
    except (aiohttp.ClientError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    except (ValueError, FrameError) as exc:  # the parser's errors, or an unstorable sample
        error = f"cannot store the exposition: {exc}"
    else:
        return ScrapeResult(target, table, None)
    columns = _Columns()
    columns.add_report(target.labels, ts_ms, up=False, seconds=monotonic() - began, samples=0)
    return ScrapeResult(target, columns.table(), error)


async def _fetch(session: aiohttp.ClientSession, url: str, max_bytes: int) -> str:
    async with session.get(url, headers={"Accept": ACCEPT}) as response:
        if response.status != 200:
            raise aiohttp.ClientResponseError(
                response.request_info, (), status=response.status, message=response.reason or ""
            )
        chunks: list[bytes] = []
        size = 0
        while chunk := await response.content.readany():
            size += len(chunk)
            if size > max_bytes:
                raise _TooLarge
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8")


@dataclass(slots=True)
class _Columns:
    """The rows of one scrape, column by column."""

    ts_ns: list[int] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    labels: list[dict[str, str] | None] = field(default_factory=list)

    def add(self, ts_ns: int, metric: str, value: float, labels: dict[str, str]) -> None:
        self.ts_ns.append(ts_ns)
        self.metrics.append(metric)
        self.values.append(value)
        self.labels.append(labels)

    def add_report(
        self, target_labels: dict[str, str], ts_ms: int, *, up: bool, seconds: float, samples: int
    ) -> None:
        """The series Prometheus records for every scrape, at the scrape's start."""
        report = {"up": float(up), DURATION: max(0.0, seconds), SAMPLES: float(samples)}
        for metric, value in report.items():
            self.add(ts_ms * 1_000_000, metric, value, dict(target_labels))

    def table(self) -> pa.Table:
        return points_table(self.ts_ns, self.metrics, self.values, self.labels)


def _parse(
    text: str,
    target_labels: dict[str, str],
    ts_ms: int,
    began: float,
    monotonic: Callable[[], float],
) -> pa.Table:
    columns = _Columns()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            row = dict(sample.labels)
            for name, value in target_labels.items():
                if name in row:
                    row[f"exported_{name}"] = row[name]
                row[name] = value
            when = ts_ms * 1_000_000
            if sample.timestamp is not None:
                when = int(float(sample.timestamp) * 1000) * 1_000_000
            columns.add(when, sample.name, float(sample.value), row)
    samples = len(columns.metrics)
    seconds = monotonic() - began
    columns.add_report(target_labels, ts_ms, up=True, seconds=seconds, samples=samples)
    return columns.table()
