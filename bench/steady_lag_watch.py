"""What `bench.steady_lag` reads while it samples: the writers' ledger against the stored
checkpoint, the daemon's lag gauge, its log's events, the audit records, writer totals."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp

from bench import _common as c
from index.audits import audit_keys
from protocol import keys
from protocol.records import IndexCheckpoint, RecordError
from store.fs import FileSystemStore

NS = 1_000_000_000


class Ledger:
    """The writers' ledger of segments, read as it grows, against the checkpoint."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self.written: dict[str, tuple[int, int]] = {}  # key -> (first_ns, written_ns)
        self.pending: set[str] = set()
        self.consumed: set[str] = set()

    def read(self) -> None:
        if not self._path.exists():
            return
        with self._path.open("rb") as file:
            file.seek(self._offset)
            data = file.read()
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].decode().splitlines():
            key, written_ns = line.split()
            self.written[key] = (
                keys.parse_index_log_segment_key(key).time_ns,
                int(written_ns),
            )
            if key not in self.consumed:
                self.pending.add(key)

    def note(self, checkpoint: IndexCheckpoint | None) -> None:
        if checkpoint is not None:
            seen = set(checkpoint.log_seen)
            self.consumed |= seen & set(self.written)
            self.pending -= seen

    def lag(self, now_ns: int) -> tuple[float, float]:
        if not self.pending:
            return 0.0, 0.0
        first = min(self.written[k][0] for k in self.pending)
        written = min(self.written[k][1] for k in self.pending)
        return max(0.0, (now_ns - first) / NS), max(0.0, (now_ns - written) / NS)


def read_checkpoint_file(root: Path) -> IndexCheckpoint | None:
    try:
        return IndexCheckpoint.from_json((root / keys.RECONCILER_INDEX_CHECKPOINT_KEY).read_bytes())
    except (FileNotFoundError, RecordError):
        return None


async def gauge(http: aiohttp.ClientSession, url: str) -> float | None:
    try:
        snapshot = await c.scrape(http, [url])
    except (aiohttp.ClientError, TimeoutError):
        return None
    return snapshot.value("lm_reconciler_log_lag_seconds")


EVENTS = (
    "audit_started",
    "audit_finished",
    "audit_worker_started",
    "audit_worker_exited",
    "catalog_compacted",
    "reconciler_stage_failed",
)


def child_pids(pid: int) -> list[int]:
    """The live children of ``pid`` (the daemon's audit worker), from /proc."""
    found: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(p) for p in (task / "children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        pass
    return found


def children_cpu_seconds(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS bytes) of ``pid``'s children: the reaped ones (``cutime`` +
    ``cstime`` of ``pid``) plus the live ones (their utime + stime), and the live ones'
    resident set now."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0, 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    cpu = (int(fields[13]) + int(fields[14])) / c.CLOCK_TICKS  # fields 16, 17: cutime, cstime
    rss = 0.0
    for child in child_pids(pid):
        try:
            cpu += c.cpu_seconds(child)
            rss += c.rss_bytes(child)
        except (FileNotFoundError, ProcessLookupError, KeyError):
            continue
    return cpu, rss


def daemon_events(log: Path, started_unix: float) -> list[tuple[float, str, str]]:
    """The daemon's audit, compaction and failure events, at seconds since the writers
    started."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("event") not in EVENTS:
            continue
        at = datetime.fromisoformat(doc["timestamp"].replace("Z", "+00:00")).timestamp()
        skip = ("timestamp", "level", "logger", "event", "epoch", "audit_id")
        detail = ", ".join(f"{k} {v}" for k, v in doc.items() if k not in skip)
        found.append((round(at - started_unix, 1), str(doc["event"]), detail))
    return found


def writer_totals(logs: Path) -> list[dict[str, Any]]:
    """The last JSON line (totals) of each writer's log, as far as written."""
    found = []
    for path in sorted(logs.glob("writer-*.log")):
        lines = path.read_text(errors="replace").splitlines()
        done = [line for line in lines if line.startswith('{"done"')]
        found.append(dict(json.loads(done[-1])) if done else {})
    return found


async def audits_in(store: FileSystemStore) -> list[dict[str, Any]]:
    found = []
    for key in await audit_keys(store):  # the records, not the audits' listing parts
        body, _etag = await store.get(key)
        doc = json.loads(body)
        found.append(
            {
                k: doc.get(k)
                for k in (
                    "audit_id",
                    "status",
                    "started_at_unix_ns",
                    "completed_at_unix_ns",
                    "counts",
                )
            }
        )
    return found
