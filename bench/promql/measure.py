"""The measurements: interleaved repeats (ours, reference, ours, reference, ...) with
wall time and the CPU seconds of each side's process tree (the collector with its engine;
the reference Prometheus), answers checked against each other; remote read throughput;
names; store requests; RSS under dashboard loops."""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

import cramjam
import numpy as np

from bench.promql.servers import Collector, Target, load, store_requests
from collector.promql.proto import read_pb2
from tests.collector.promql.xor_decode import decode_xor_many, read_frames


@dataclass
class Timing:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    @property
    def wall_median(self) -> float:
        return statistics.median(self.wall) if self.wall else math.nan

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu) if self.cpu else math.nan


def timed(target: Target, path: str, params: dict[str, str]) -> tuple[float, float, Any]:
    cpu = target.cpu()
    started = time.perf_counter()
    answer = target.query(path, params)
    wall = time.perf_counter() - started
    if answer.get("status") != "success":
        raise RuntimeError(f"{target.name} {path} {params}: {str(answer)[:500]}")
    return wall, target.cpu() - cpu, answer


def summary(answer: Any) -> tuple[int, int, float]:
    """(series, points, sum of finite values) of a query_range/query answer."""
    result = answer["data"]["result"]
    points = total = 0.0
    for series in result:
        values = series.get("values") or [series["value"]]
        numbers = np.array([float(v) for _, v in values])
        points += len(numbers)
        total += float(numbers[np.isfinite(numbers)].sum())
    return len(result), int(points), total


def agree(ours: Any, reference: Any) -> bool:
    a, b = summary(ours), summary(reference)
    return a[:2] == b[:2] and math.isclose(a[2], b[2], rel_tol=1e-9, abs_tol=1e-9)


@dataclass
class Compared:
    label: str
    ours: Timing
    reference: Timing
    agree: bool
    shape: tuple[int, int, float]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]

    @property
    def ratio(self) -> float:
        return self.ours.wall_median / self.reference.wall_median


def interleaved(
    label: str, ours: Target, reference: Target, path: str, params: dict[str, str], repeats: int
) -> Compared:
    """One warm-up each, then ``repeats`` rounds of ours then the reference."""
    load_before = load()
    _, _, first = timed(ours, path, params)
    _, _, ref_answer = timed(reference, path, params)
    result = Compared(
        label,
        Timing(),
        Timing(),
        agree(first, ref_answer),
        summary(first),
        load_before,
        load_before,
    )
    for _ in range(repeats):
        for side, timing in ((ours, result.ours), (reference, result.reference)):
            wall, cpu, _ = timed(side, path, params)
            timing.wall.append(wall)
            timing.cpu.append(cpu)
    result.load_after = load()
    return result


# --- remote read ---------------------------------------------------------------------------

SAMPLES, STREAMED = 0, 1


def read_body(start_ms: int, end_ms: int, response_type: int) -> bytes:
    query = read_pb2.Query(start_timestamp_ms=start_ms, end_timestamp_ms=end_ms)
    query.matchers.add(type=2, name="__name__", value=".+")
    request = read_pb2.ReadRequest(queries=[query])
    request.accepted_response_types.append(response_type)  # type: ignore[arg-type]
    return bytes(cramjam.snappy.compress_raw(request.SerializeToString()))


def remote_read(target: Target, body: bytes, response_type: int) -> dict[str, float]:
    """One read of everything: wall time to the last byte, client decode time, samples."""
    request = urllib.request.Request(target.url + "/api/v1/read", data=body, method="POST")
    request.add_header("Content-Type", "application/x-protobuf")
    request.add_header("Content-Encoding", "snappy")
    request.add_header("X-Prometheus-Remote-Read-Version", "0.1.0")
    if target.token is not None:
        request.add_header("Authorization", f"Bearer {target.token}")
    cpu = target.cpu()
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        payload = response.read()
    wall = time.perf_counter() - started
    server_cpu = target.cpu() - cpu
    started = time.perf_counter()
    if response_type == SAMPLES:
        answer = read_pb2.ReadResponse.FromString(bytes(cramjam.snappy.decompress_raw(payload)))
        samples = sum(len(ts.samples) for r in answer.results for ts in r.timeseries)
    else:
        chunks = [c.data for f in read_frames(payload) for s in f.chunked_series for c in s.chunks]
        samples = sum(len(ts) for ts, _ in decode_xor_many(chunks))
    decode = time.perf_counter() - started
    return {
        "wall_s": wall,
        "server_cpu_s": server_cpu,
        "decode_s": decode,
        "samples": samples,
        "bytes": len(payload),
    }


def read_throughput(
    ours: Target, reference: Target, start_ms: int, end_ms: int, repeats: int
) -> dict[str, Any]:
    out: dict[str, Any] = {"load_before": load()}
    for name, kind in (("SAMPLES", SAMPLES), ("STREAMED_XOR_CHUNKS", STREAMED)):
        body = read_body(start_ms, end_ms, kind)
        runs: dict[str, list[dict[str, float]]] = {"ours": [], "reference": []}
        for _ in range(repeats):
            for side in (ours, reference):
                runs[side.name].append(remote_read(side, body, kind))
        out[name] = {
            side: {key: statistics.median(r[key] for r in results) for key in results[0]}
            for side, results in runs.items()
        }
    out["load_after"] = load()
    return out


# --- names, store requests --------------------------------------------------------------


def names(target: Target, start_s: int, end_s: int, repeats: int) -> dict[str, Any]:
    """``label/__name__/values`` and ``labels``: the first (cold) call, then the median."""
    out: dict[str, Any] = {}
    for path in ("/api/v1/label/__name__/values", "/api/v1/labels"):
        params = {"start": str(start_s), "end": str(end_s)}
        times = []
        size = 0
        for _ in range(repeats + 1):
            wall, _, answer = timed(target, path, params)
            times.append(wall)
            size = len(answer["data"])
        out[path] = {"cold_s": times[0], "warm_median_s": statistics.median(times[1:]), "n": size}
    return out


def requests_for(collector: Collector, params: dict[str, str]) -> dict[str, Any]:
    before = store_requests(collector)
    timed(collector.target, "/api/v1/query_range", params)
    after = store_requests(collector)
    delta = {op: after.get(op, 0) - before.get(op, 0) for op in after}
    return {"startup": before, "query": {k: v for k, v in delta.items() if v}}


# --- RSS under loops ---------------------------------------------------------------------


def loops_rss(
    target: Target, panels: list[dict[str, str]], loops: int, duration_s: float
) -> dict[str, Any]:
    """``loops`` threads each running the dashboard's panels in turn for ``duration_s``;
    the tree's RSS sampled every 0.25 s (idle: before the loops)."""
    idle_parts = target.rss_parts()
    idle = sum(idle_parts.values())
    stop = threading.Event()
    counts = {"queries": 0, "errors": 0}
    lock = threading.Lock()
    errors: list[str] = []

    def loop(offset: int) -> None:
        n = offset
        while not stop.is_set():
            params = panels[n % len(panels)]
            n += 1
            answer = target.query("/api/v1/query_range", params)
            ok = answer.get("status") == "success"
            with lock:
                counts["queries" if ok else "errors"] += 1
                if not ok and len(errors) < 5:
                    errors.append(str(answer)[:300])
            if not ok:  # as a dashboard would retry: later, jittered
                time.sleep(random.uniform(0.5, 1.0))

    load_before = load()
    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(loops)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    peak = idle
    parts: dict[str, int] = {}
    while time.monotonic() - started < duration_s:
        sizes = target.rss_parts()
        peak = max(peak, sum(sizes.values()))
        for part, size in sizes.items():
            parts[part] = max(parts.get(part, 0), size)
        time.sleep(0.25)  # the RSS sampling period
    stop.set()
    for thread in threads:
        thread.join(timeout=600)
    return {
        "idle_rss": idle,
        "peak_rss": peak,
        "over_idle": peak - idle,
        "idle_parts": idle_parts,
        "peak_parts": parts,
        **counts,
        "seconds": time.monotonic() - started,
        "errors_seen": errors,
        "load_before": load_before,
        "load_after": load(),
    }
