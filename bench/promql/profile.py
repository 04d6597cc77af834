"""Where a panel query's time goes: the engine's own timings (``stats=all``, forwarded to
the engine; the reference's beside it) and a py-spy profile of the collector (every
thread, sampled at 100 Hz, while the query runs ``--repeats`` times), summarised as the
functions with the most samples on top of the stack (self) and anywhere on it (inclusive).

``python -m bench.promql.profile [--query NAME] [--repeats N]`` (needs ``pip install
py-spy`` in the venv)."""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.promql.fixture import DATA_DIR
from bench.promql.fleet import MONTH0_S, T_END_S
from bench.promql.run import DAY_RANGE, MONTH_PANEL, PANELS
from bench.promql.servers import hardlink_copy, start_query_collector, start_reference

PY_SPY = Path(sys.executable).parent / "py-spy"


def timings(answer: Any) -> dict[str, float]:
    data = answer.get("data")
    return dict(data.get("stats", {}).get("timings", {})) if isinstance(data, dict) else {}


def collapsed(path: Path, top: int = 20) -> dict[str, list[tuple[str, float]]]:
    """py-spy's raw (collapsed) stacks → the ``top`` frames by self and inclusive share."""
    own: collections.Counter[str] = collections.Counter()
    anywhere: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1] for f in stack.split(";")[1:]]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            anywhere[frame] += count
    return {
        "self": [(f, n / total) for f, n in own.most_common(top)],
        "inclusive": [(f, n / total) for f, n in anywhere.most_common(top)],
        "samples": [("total", float(total))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.promql.profile")
    parser.add_argument("--query", choices=sorted(PANELS), default="histogram_quantile")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--names", action="store_true", help="profile label/__name__/values over 30 days instead"
    )
    parser.add_argument(
        "--month", action="store_true", help="profile the 30-day panel on the month store"
    )
    args = parser.parse_args()
    base = next(DATA_DIR.glob("v*-sparse*"))
    path, params = "/api/v1/query_range", {"query": PANELS[args.query], **DAY_RANGE, "stats": "all"}
    if args.names:
        path, params = (
            "/api/v1/label/__name__/values",
            {"start": str(MONTH0_S), "end": str(T_END_S)},
        )
        base = DATA_DIR / "names-v1"
    stored = "store" if args.names else "month" if args.month else "day"
    if args.month:
        params = {"query": MONTH_PANEL, "start": str(MONTH0_S + 3600), "end": str(T_END_S)}
        params.update(step="3600", stats="all")
    with tempfile.TemporaryDirectory(prefix="bench-promql-profile-") as tmp:
        work = Path(tmp)
        store = hardlink_copy(base / stored, work / "day")
        collector = start_query_collector(
            f"file://{store}", work / "collector", engine=not args.names
        )
        reference = None
        out: dict[str, Any] = {"path": path, "params": params, "ours": [], "reference": []}
        try:
            collector.target.query(path, params)  # warm
            sides = [("ours", collector.target)]
            if not args.names:
                reference = start_reference(base / "reference", work / "reference")
                sides.append(("reference", reference.target))
            for _ in range(args.repeats):
                for name, side in sides:
                    started = time.perf_counter()
                    answer = side.query(path, params)
                    out[name].append({"wall_s": time.perf_counter() - started, **timings(answer)})
            raw = work / "py-spy.txt"
            spy = subprocess.Popen(
                [
                    str(PY_SPY),
                    "record",
                    "--pid",
                    str(collector.process.pid),
                    "--rate",
                    "100",
                    "--format",
                    "raw",
                    "--threads",
                    "--output",
                    str(raw),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            time.sleep(1.0)  # py-spy attaches
            started = time.perf_counter()
            for _ in range(args.repeats):
                collector.target.query(path, params)
            out["profiled_s"] = time.perf_counter() - started
            spy.send_signal(2)  # SIGINT: py-spy writes its output and exits
            _, err = spy.communicate(timeout=60)
            out["profile"] = collapsed(raw) if raw.exists() else {"error": err.decode()[-500:]}
        finally:
            collector.stop()
            if reference is not None:
                reference.stop()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
