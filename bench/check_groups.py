"""What checking frames in groups could save: the points rules over N frames' rows at once
against one frame at a time (issue 33's CPU target; not built).

``python -m bench.check_groups [--frames 640] [--points 575] [--groups 4,8] [--rounds 3]``

The collector checks each frame on its own (`protocol.frame.check_payload`): about 60
`pyarrow.compute` calls, whose fixed cost per call, not the rows, is most of a 575-point
frame's check. This measures, in one thread with every frame already decompressed and
read (`_payload_table`, timed separately as the floor no grouping removes):

- ``one at a time``: `checked_points` on each frame's table (the baseline);
- ``groups of N``: `checked_points` once on N frames' tables concatenated.

The groups are an upper bound on the saving: a real grouped check would also need each
frame's own time range and decoded size (a call or two per frame more) and a fallback
that checks a failing group's frames one at a time to name the bad one. Rounds alternate
the phases; the medians are reported. CPU is this process's (``time.process_time``), so
the machine's load matters only through caches; say how loaded it was.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from itertools import islice

import pyarrow as pa

from agent.load import LoadSpec, SyntheticLoad
from protocol._points_check import checked_points
from protocol.frame import FrameHeader, _payload_table, decode_header

MAX_RAW_BYTES = 64 * 1024 * 1024
Batch = list[tuple[bytes, FrameHeader]]
FLOOR = "read only (the floor)"


def frames(count: int, points: int) -> Batch:
    agents = 64
    load = SyntheticLoad(
        LoadSpec(agents=agents, batches=-(-count // agents), points_per_batch=points)
    )
    return [(p.frame, decode_header(p.frame)) for p in islice(load.originals(), count)]


def tables(batch: Batch) -> list[pa.Table]:
    return [_payload_table(frame, header, MAX_RAW_BYTES) for frame, header in batch]


def read_only(batch: Batch) -> None:
    tables(batch)


def one_at_a_time(batch: Batch) -> None:
    for (_, header), table in zip(batch, tables(batch), strict=True):
        checked_points(table, expected_rows=header.record_count, max_decoded_bytes=MAX_RAW_BYTES)


def in_groups(size: int) -> Callable[[Batch], None]:
    def run(batch: Batch) -> None:
        for start in range(0, len(batch), size):
            group = batch[start : start + size]
            checked_points(pa.concat_tables(tables(group)), max_decoded_bytes=MAX_RAW_BYTES)

    return run


def cpu_us_per_frame(run: Callable[[Batch], None], batch: Batch) -> float:
    started = time.process_time()
    run(batch)
    return (time.process_time() - started) / len(batch) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=640)
    parser.add_argument("--points", type=int, default=575, help="points per frame (64 KiB)")
    parser.add_argument("--groups", default="4,8", help="group sizes, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    batch = frames(args.frames, args.points)
    phases: dict[str, Callable[[Batch], None]] = {
        FLOOR: read_only,
        "one at a time": one_at_a_time,
    }
    for size in (int(s) for s in args.groups.split(",")):
        phases[f"groups of {size}"] = in_groups(size)
    for phase in phases.values():
        phase(batch[:32])  # warm
    samples: dict[str, list[float]] = {name: [] for name in phases}
    for _ in range(args.rounds):
        for name, phase in phases.items():
            samples[name].append(cpu_us_per_frame(phase, batch))
    median = {name: statistics.median(values) for name, values in samples.items()}
    floor = median[FLOOR]
    base = median["one at a time"] - floor
    print(f"{len(batch)} frames of {args.points} points, {args.rounds} rounds, medians:")
    for name, value in median.items():
        if name == FLOOR:
            print(f"  {name:<24} {value:7.1f} us a frame")
            continue
        check = value - floor
        print(
            f"  {name:<24} {value:7.1f} us a frame, checks {check:6.1f} us "
            f"({check / base:.2f}x one at a time)"
        )


if __name__ == "__main__":
    main()
