"""A run's JSON (``--json``) as the Markdown tables of bench/RESULTS.md:
``python -m bench.promql.report RUN.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

MiB = 2**20
MONTH_PANEL = 'rate(process_cpu_seconds_total{job="api"}[1h])'


def _load(values: Any) -> str:
    return "/".join(f"{v:.1f}" for v in values)


def render(r: dict[str, Any]) -> str:
    out = [f"Load: start `{r['uptime_start']}`; end `{r['uptime_end']}`.", ""]
    out += [
        "| panel (24 h, step 60 s, warm) | ours median s | reference median s | ratio (<= 3) "
        "| ours CPU s | reference CPU s | cold s (CPU s) | answers agree | series, points "
        "| load before → after |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---|",
    ]
    for name, p in r["panels"].items():
        cold = r["cold"][name]
        verdict = "MET" if p["ratio"] <= 3 else "MISSED"
        out.append(
            f"| `{name}` | {p['ours_wall_median_s']:.3f} | {p['reference_wall_median_s']:.3f} "
            f"| **{p['ratio']:.2f} {verdict}** | {p['ours_cpu_median_s']:.2f} "
            f"| {p['reference_cpu_median_s']:.2f} | {cold['wall_s']:.2f} ({cold['cpu_s']:.2f}) "
            f"| {p['agree']} | {p['series_points_sum'][0]}, {p['series_points_sum'][1]} "
            f"| {_load(p['load_before'])} → {_load(p['load_after'])} |"
        )
    m = r["month"]
    w = m["warm"]
    verdict = "MET" if w["ours_wall_median_s"] <= 2 else "MISSED"
    out += [
        "",
        f"30-day panel (`{MONTH_PANEL}`, step 1 h): warm ours **{w['ours_wall_median_s']:.3f} s {verdict}** (<= 2 s; "
        f"{w['ours_cpu_median_s']:.2f} CPU s), reference {w['reference_wall_median_s']:.3f} s "
        f"({w['reference_cpu_median_s']:.2f} CPU s), cold (fs) {m['cold']['wall_s']:.2f} s "
        f"({m['cold']['cpu_s']:.2f} CPU s), agree {w['agree']}, load "
        f"{_load(w['load_before'])} → {_load(w['load_after'])}.",
        "",
        "| remote read, 5.76M samples | ours wall s | ours server CPU s | ours samples/s (wall) "
        "| reference wall s | reference server CPU s | reference samples/s | body MB ours / ref "
        "| client decode s ours / ref |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in ("SAMPLES", "STREAMED_XOR_CHUNKS"):
        o, f = r["remote_read"][kind]["ours"], r["remote_read"][kind]["reference"]
        out.append(
            f"| {kind} | {o['wall_s']:.2f} | {o['server_cpu_s']:.2f} "
            f"| {o['samples'] / o['wall_s'] / 1e6:.2f}M | {f['wall_s']:.2f} "
            f"| {f['server_cpu_s']:.2f} | {f['samples'] / f['wall_s'] / 1e6:.2f}M "
            f"| {o['bytes'] / 1e6:.1f} / {f['bytes'] / 1e6:.1f} "
            f"| {o['decode_s']:.2f} / {f['decode_s']:.2f} |"
        )
    out += [
        "",
        "| names (100,000 series) | warm median s | cold s | values | target <= 1 s |",
        "|---|---:|---:|---:|---|",
    ]
    for span, paths in r["names"].items():
        for path, n in paths.items():
            worst = max(n["warm_median_s"], n["cold_s"])
            out.append(
                f"| {span} `{path}` | {n['warm_median_s']:.3f} | {n['cold_s']:.3f} | {n['n']} "
                f"| **{'MET' if worst <= 1 else 'MISSED'}** |"
            )
    rss = r["rss"]
    o, f = rss["ours"], rss["reference"]
    out += [
        "",
        f"RSS, {r['args']['loops']} loops x {len(rss['panels'])} panels for "
        f"{o['seconds']:.0f} s: ours idle {o['idle_rss'] / MiB:.0f} MiB, peak "
        f"{o['peak_rss'] / MiB:.0f} MiB, **{o['over_idle'] / MiB:.0f} MiB over idle "
        f"{'MET' if o['over_idle'] <= 1024 * MiB else 'MISSED'}** (<= 1 GiB; peaks: collector "
        f"{o['peak_parts']['main'] / MiB:.0f} MiB, engine {o['peak_parts']['children'] / MiB:.0f}"
        f" MiB), {o['queries']} answers, {o['errors']} errors; reference idle "
        f"{f['idle_rss'] / MiB:.0f} MiB, peak {f['peak_rss'] / MiB:.0f} MiB, "
        f"{f['queries']} answers, {f['errors']} errors. Settings: {rss['settings']}.",
        "",
        f"Store requests of a 1 h query (fresh collector), lm_store_request_seconds_count: 1 day "
        f"{m['requests 1 day']['query']}, 30 days {m['requests 30 days']['query']}: equal "
        f"**{m['requests_equal']}**.",
    ]
    s3 = r.get("s3_cold")
    if s3:
        out.append(
            f"Every S3 request (counting proxy on MiniStack): 1 day {s3['requests day']}, "
            f"30 days {s3['requests month']}: equal **{s3.get('requests_equal')}**."
        )
        out += ["", "| S3 cold (MiniStack, delay proxy) | wall s | CPU s |", "|---|---:|---:|"]
        for key, value in s3.items():
            if " at " in key:
                cpu = f"{value['cpu_s']:.2f}" if "cpu_s" in value else value.get("error", "")
                out.append(f"| {key} | {value['wall_s']:.2f} | {cpu} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(render(json.loads(Path(sys.argv[1]).read_text())))
