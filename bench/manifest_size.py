"""How big a rollup snapshot manifest gets after a year of hourly runs (issue 24 item 10).

Pure: every commit goes through `rollup.table.manifest.apply` exactly as the job, compaction
and ``delete`` build them, nothing is written. One simulated hour (at ``:05``):

- the rollup run includes the batches accepted since the last run: one ledger file for
  the previous accepted hour and one for the current one (its first five minutes); it
  writes ``--tasks`` points files for the previous data hour and rewrites that hour's
  ``rollup_1m`` file (data files carry min/max statistics of realistic width);
- ``compact_after_run`` then merges the hour's points files into one and, with the
  ledger merge (``--no-ledger-merge``: the old behaviour, files kept per run), every
  accepted hour's ledger files into one;
- once a week an operator ``delete`` adds a tombstone for a day of one series;
- retention (``--retention-points-days``/``--retention-rollup-days``, default 30/365)
  drops old hours and, with it, tombstones whose range it dropped from every table
  (``--keep-tombstones``: the old behaviour).

Printed: the final manifest's bytes by part (data files, ledger files, ledger hours,
tombstones), its parse time (`Snapshot.from_json`, this machine), and both for the old
behaviour. ``--hours`` shortens the simulated period (default 8760, a year; a year takes
a few minutes: each commit copies the snapshot, as the real one does).

    .venv/bin/python -m bench.manifest_size               # a year, default retention
    .venv/bin/python -m bench.manifest_size --no-retention --hours 2000
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from protocol import keys
from protocol.setsum import Setsum
from rollup.table.manifest import Changes, DataFile, LedgerHour, Snapshot, format_created_at
from rollup.table.manifest_codec import snapshot_from_json
from rollup.table.tombstones import Tombstone
from rollup.table.transition import apply

START = keys.UtcHour.parse_iso("2026-01-01T00")
SERIES = 'node_cpu_seconds_total{cpu="0",host="web-017.example.internal",mode="idle"}'


@dataclass(frozen=True)
class Options:
    hours: int = 8760
    tasks: int = 4
    ledger_merge: bool = True
    drop_tombstones: bool = True
    retention_points_days: int | None = 30
    retention_rollup_days: int | None = 365


def _stats(hour: keys.UtcHour, table: str) -> tuple[dict[str, object], dict[str, object]]:
    start = datetime.fromtimestamp(hour.start_ns // 10**9, tz=UTC)
    low: dict[str, object] = {
        "ts" if table == "points" else "window_start": _ts(start),
        "metric": "a_metric",
    }
    high: dict[str, object] = {
        "ts" if table == "points" else "window_start": _ts(start + timedelta(minutes=59)),
        "metric": "zz_metric_name",
    }
    low.update(series=SERIES[:40], value=-1.5)
    high.update(series=SERIES, value=98765.4321)
    if table == "points":
        low.update(agent_id="agent-000001", boot_id=str(uuid.UUID(int=1)), seq=0)
        high.update(agent_id="agent-999999", boot_id=str(uuid.UUID(int=2**120)), seq=10**9)
    else:
        for name in ("count", "sum", "min", "max", "first", "last"):
            low[name], high[name] = 0.0, 123456.789
        low.update(first_ts=low["window_start"], last_ts=low["window_start"])
        high.update(first_ts=high["window_start"], last_ts=high["window_start"])
    return low, high


def _ts(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _file(table: str, hour: keys.UtcHour, version: int) -> DataFile:
    low, high = _stats(hour, table)
    return DataFile(
        path=keys.rollup_data_key(table, hour, str(uuid.uuid4())),
        table=table,
        partition=hour,
        row_count=1_234_567,
        size_bytes=45_678_901,
        min=low,
        max=high,
        added_version=version,
    )


def _ledger(hour: keys.UtcHour) -> tuple[str, LedgerHour]:
    total = Setsum.of([(str(uuid.uuid4()), "a" * 64)]).hex
    return keys.rollup_ledger_key(hour, str(uuid.uuid4())), LedgerHour(3600, 3_600_000, total)


def _commit(base: Snapshot | None, changes: Changes, at: keys.UtcHour) -> Snapshot:
    return apply(
        base,
        changes,
        version=(base.version if base else 0) + 1,
        commit_id=str(uuid.uuid4()),
        owner_epoch=1,
        created_at=format_created_at(at.start_ns + 300 * 10**9),
        manifest_key_of_base=base.manifest_key if base else None,
    )


def simulate(options: Options) -> Snapshot:
    """The snapshot after ``options.hours`` simulated hours (see the module doc)."""
    snapshot: Snapshot | None = None
    for step in range(2, options.hours + 2):
        now, data_hour = START.shifted(step), START.shifted(step - 1)
        version = (snapshot.version if snapshot else 0) + 1
        removed = [
            f.path
            for f in (snapshot.data_files("rollup_1m") if snapshot else ())
            if f.partition == data_hour
        ]
        added = [_file("points", data_hour, version) for _ in range(options.tasks)]
        added.append(_file("rollup_1m", data_hour, version))
        ledger = dict(_ledger(h) for h in (data_hour, now))
        retention, dropped = _retention(snapshot, options, now)
        tombstones: tuple[Tombstone, ...] = ()
        if step % 168 == 0:
            tombstones = (_tombstone(now, step),)
        snapshot = _commit(
            snapshot,
            Changes(
                added_files=tuple(added),
                removed_files=tuple(removed + dropped),
                added_ledger_files=tuple(ledger),
                ledger_delta={
                    keys.UtcHour.parse_iso(_hour_of(k)).iso: v for k, v in ledger.items()
                },
                added_tombstones=tombstones,
                retention=retention,
            ),
            now,
        )
        snapshot = _compact(snapshot, options, data_hour, now)
    assert snapshot is not None
    return snapshot


def _hour_of(ledger_key: str) -> str:
    rest = ledger_key.removeprefix(keys.ROLLUP_LEDGER_PREFIX).rsplit("/", 1)[0]
    return keys.UtcHour.parse_partition(rest).iso


def _retention(
    snapshot: Snapshot | None, options: Options, now: keys.UtcHour
) -> tuple[dict[str, str], list[str]]:
    cutoffs: dict[str, str] = {}
    for table, days in (
        ("points", options.retention_points_days),
        ("rollup_1m", options.retention_rollup_days),
    ):
        if days is not None:
            cutoffs[table] = now.shifted(-24 * days).iso
    dropped = [
        f.path
        for table, first_kept in cutoffs.items()
        for f in (snapshot.data_files(table) if snapshot else ())
        if f.partition.iso < first_kept
    ]
    return cutoffs, dropped


def _tombstone(now: keys.UtcHour, step: int) -> Tombstone:
    day_start = datetime.fromtimestamp(now.shifted(-48).start_ns // 10**9, tz=UTC)
    return Tombstone(
        id=str(uuid.UUID(int=step)),
        metric="node_cpu_seconds_total",
        labels=(("host", "web-017.example.internal"),),
        start=day_start,
        end=day_start + timedelta(days=1),
        tables=("points", "rollup_1m"),
        requested_by="ops@example.internal",
        reason="a broken exporter reported nonsense for a day (INC-1234)",
        created_at=format_created_at(now.start_ns),
    )


def _compact(
    snapshot: Snapshot, options: Options, data_hour: keys.UtcHour, now: keys.UtcHour
) -> Snapshot:
    points = [f for f in snapshot.data_files("points") if f.partition == data_hour]
    merged = _file("points", data_hour, snapshot.version + 1)
    removed_ledger: list[str] = []
    added_ledger: list[str] = []
    if options.ledger_merge:
        by_hour: dict[str, list[str]] = {}
        for path in snapshot.ledger_files:
            by_hour.setdefault(_hour_of(path), []).append(path)
        for hour, paths in by_hour.items():
            if len(paths) >= 2:
                removed_ledger += paths
                added_ledger.append(_ledger(keys.UtcHour.parse_iso(hour))[0])
    changes = Changes(
        added_files=(merged,),
        removed_files=tuple(f.path for f in points),
        added_ledger_files=tuple(added_ledger),
        removed_ledger_files=tuple(removed_ledger),
    )
    compacted = _commit(snapshot, changes, now)
    if not options.drop_tombstones:  # the old behaviour: every tombstone stays
        kept = {t.id for t in compacted.tombstones}
        lost = tuple(t for t in snapshot.tombstones if t.id not in kept)
        compacted = replace(compacted, tombstones=lost + compacted.tombstones)
    return compacted


def measure(snapshot: Snapshot) -> dict[str, object]:
    """Bytes of the manifest and of its parts, and the parse time."""
    body = snapshot.to_json()
    document = json.loads(body)

    def size(value: object) -> int:
        return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())

    started = time.perf_counter()
    snapshot_from_json(body)
    parse_s = time.perf_counter() - started
    return {
        "manifest_bytes": len(body),
        "data_files": sum(len(t["data_files"]) for t in document["tables"].values()),
        "data_files_bytes": size(document["tables"]),
        "ledger_files": len(document["ledger"]["files"]),
        "ledger_files_bytes": size(document["ledger"]["files"]),
        "ledger_hours": len(document["ledger"]["hours"]),
        "ledger_hours_bytes": size(document["ledger"]["hours"]),
        "tombstones": len(document["tombstones"]),
        "tombstones_bytes": size(document["tombstones"]),
        "parse_seconds": round(parse_s, 3),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.manifest_size", description=__doc__)
    parser.add_argument("--hours", type=int, default=8760)
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--retention-points-days", type=int, default=30)
    parser.add_argument("--retention-rollup-days", type=int, default=365)
    parser.add_argument("--no-retention", action="store_true")
    parser.add_argument(
        "--only-bounded", action="store_true", help="skip the old behaviour (halves the time)"
    )
    args = parser.parse_args(argv)
    base = Options(
        hours=args.hours,
        tasks=args.tasks,
        retention_points_days=None if args.no_retention else args.retention_points_days,
        retention_rollup_days=None if args.no_retention else args.retention_rollup_days,
    )
    for name, options in (
        ("bounded (ledger merged per hour, applied tombstones dropped)", base),
        (
            "before (ledger file per run and hour, tombstones kept)",
            replace(base, ledger_merge=False, drop_tombstones=False),
        ),
    ):
        if args.only_bounded and not options.ledger_merge:
            continue
        started = time.perf_counter()
        result = measure(simulate(options))
        result["simulated_seconds"] = round(time.perf_counter() - started, 1)
        print(f"{name}:\n{json.dumps(result, indent=1)}", flush=True)


if __name__ == "__main__":
    main()
