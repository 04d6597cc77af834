"""One scrape of one Prometheus text endpoint → a points table (``lm-agent scrape``).

`scrape_target` GETs the target (``Accept: text/plain;version=0.0.4``) within the scrape
timeout, reading at most ``max_bytes`` of body, parses it with
``prometheus_client.parser.text_string_to_metric_families`` in a worker thread and
returns one row per sample plus ``up`` (1 on success), as Prometheus does:

- metric: the sample's name (``http_requests_total``, ``latency_bucket``, ...);
- labels: the sample's labels, then the target's labels (``instance`` = the target's
  ``host:port``, plus the configured ones), which win; a scraped label they replace is
  kept as ``exported_<name>``;
- ts: the sample's own timestamp when the exposition carries one, else the time the
  scrape started (milliseconds, as Prometheus records it).

A failed scrape (connection error, non-200, timeout, body over ``max_bytes``, parse
error, or a sample a frame cannot carry) yields only ``up = 0`` and the reason.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from protocol.frame import FrameError
from protocol.frame_encode import points_table

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"


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
    points: pa.Table  # always at least the ``up`` row
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
) -> ScrapeResult:
    """Scrape ``target`` once (see the module docstring). Never raises for the target's
    failures; they are in `ScrapeResult.error`."""
    ts_ms = started_ns // 1_000_000
    try:
        async with asyncio.timeout(timeout_s):
            text = await _fetch(session, target.url, max_bytes)
        table = await asyncio.to_thread(_parse, text, target.labels, ts_ms)
    except TimeoutError:
        return _failed(target, ts_ms, f"no answer within {timeout_s:g}s")
    except _TooLarge:
        return _failed(target, ts_ms, f"body larger than {max_bytes} bytes")
    except (aiohttp.ClientError, OSError) as exc:
        return _failed(target, ts_ms, f"{type(exc).__name__}: {exc}")
    except (ValueError, FrameError) as exc:  # the parser's errors, or an unstorable sample
        return _failed(target, ts_ms, f"cannot store the exposition: {exc}")
    return ScrapeResult(target, table, None)


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


def _parse(text: str, target_labels: dict[str, str], ts_ms: int) -> pa.Table:
    ts_ns: list[int] = []
    metrics: list[str] = []
    values: list[float] = []
    labels: list[dict[str, str] | None] = []
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
            ts_ns.append(when)
            metrics.append(sample.name)
            values.append(float(sample.value))
            labels.append(row)
    ts_ns.append(ts_ms * 1_000_000)
    metrics.append("up")
    values.append(1.0)
    labels.append(dict(target_labels))
    return points_table(ts_ns, metrics, values, labels)


def _failed(target: Target, ts_ms: int, error: str) -> ScrapeResult:
    table = points_table([ts_ms * 1_000_000], ["up"], [0.0], [dict(target.labels)])
    return ScrapeResult(target, table, error)
