"""The full audit's ranged, parallel, resumable listing (PROTOCOL §3.9, issue 23 item 1)."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import urllib.parse
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from index.audits import audit_keys
from protocol import keys
from protocol.clock import ManualClock
from protocol.records import AuditRecord
from reconciler.audit import listing as audit_listing
from reconciler.audit.inventory import InventorySource
from reconciler.audit.listing import (
    LISTING_SCHEMA,
    ListingParts,
    list_for_audit,
    parts_from_inventory,
)
from reconciler.audit.ranges import (
    KIND_PREFIXES,
    KINDS,
    ListingPlanError,
    parse_plan,
    plan_json,
    ranges_from_groups,
)
from reconciler.audit.records import KEEP_AUDITS, create_audit, trim_old_audits
from store.base import ObjectStore
from store.memory import MemoryStore
from store.s3 import S3Store
from tests.reconciler.conftest import context
from tests.reconciler.counting_list_store import Crashed, HangAfterParts, ListRecorder
from tests.s3_servers import RunningServer, fresh_bucket

AUDIT_DIR = keys.audit_listing_prefix(1_700_000_000_000_000_000, "0123abcd")
REPO = Path(__file__).resolve().parents[2]


def accepted(agent: int, seq: int) -> str:
    return f"accepted/v1/agent={agent:04x}/boot={'0' * 32}/{seq:020d}-{seq:020d}.json"


def quarantined(agent: int, seq: int) -> str:
    sha = hashlib.sha256(f"q{agent}-{seq}".encode()).hexdigest()
    return f"{keys.QUARANTINE_PREFIX}agent={agent:04x}/boot={'0' * 32}/{seq:020d}-{seq:020d}/{sha}.json"


def blob(n: int) -> str:
    return keys.raw_blob_key(hashlib.sha256(str(n).encode()).hexdigest())


# Keys outside every group, around and between them: each must be listed exactly once.
JUNK = [
    "accepted/v1/0",
    "accepted/v1/agent=0001.x",  # sorts just before the folder agent=0001/
    "accepted/v1/agent=0001",
    "accepted/v1/agent=0003/stray",
    "accepted/v1/junk",
    "accepted/v1/junkdir/k",
    "accepted/v1/~",
    "quarantine/v1/a",
    "quarantine/v1/identity-conflict/loose",
    "quarantine/v1/identity-conflict/agent=0002.x",
    "quarantine/v1/zz/x",
    "raw-blobs/v1/x",
    "raw-blobs/v1/sha256/0",
    "raw-blobs/v1/sha256/00x",
    "raw-blobs/v1/sha256/7f/y",
    "raw-blobs/v1/sha256/ff0",
    "raw-blobs/v1/sha256/zz/x",
    "raw-blobs/v1/~",
]
OUTSIDE = ["accepted/v10/x", "accepted-by-time/v1/x", "quarantine/v2/x", "raw-blobs/v2/x", "z"]
BIG: dict[str, int] = dict.fromkeys(KINDS, 10**9)
"""Previous counts that cut every prefix into the most ranges (a small store is listed
in one range a prefix: `tests.reconciler.test_audit_range_sizes`)."""


def world(agents: int, per_agent: int, blobs: int) -> list[str]:
    found = [accepted(a, s) for a in range(agents) for s in range(per_agent)]
    found += [quarantined(a, s) for a in range(0, agents, 3) for s in range(2)]
    return found + [blob(n) for n in range(blobs)] + JUNK


async def put_all(store: ObjectStore, names: list[str], parallel: int = 64) -> None:
    limit = asyncio.Semaphore(parallel)

    async def put(key: str) -> None:
        async with limit:
            await store.put(key, key.encode())

    await asyncio.gather(*(put(key) for key in names))


async def read_parts(store: ObjectStore, listing: ListingParts) -> dict[str, list[tuple[str, str]]]:
    """(key, etag) of every row of every part, per kind, in part order."""
    rows: dict[str, list[tuple[str, str]]] = {}
    for kind in KINDS:
        rows[kind] = []
        for part in listing.parts[kind]:
            body, _etag = await store.get(part)
            table = pq.read_table(io.BytesIO(body))
            assert table.schema.remove_metadata() == LISTING_SCHEMA
            rows[kind] += zip(table["key"].to_pylist(), table["etag"].to_pylist(), strict=True)
    return rows


async def expected_rows(store: ObjectStore) -> dict[str, list[tuple[str, str]]]:
    return {
        kind: [(info.key, info.etag) async for info in store.list(KIND_PREFIXES[kind])]
        for kind in KINDS
    }


async def test_ranges_tile_each_prefix_and_list_every_key_exactly_once() -> None:
    store = MemoryStore()
    await put_all(store, world(agents=40, per_agent=7, blobs=600) + OUTSIDE)
    progress: list[tuple[int, int]] = []
    listing = await list_for_audit(
        store,
        AUDIT_DIR,
        concurrency=3,
        progress=lambda d, t: progress.append((d, t)),
        previous=BIG,
    )
    rows = await read_parts(store, listing)
    assert rows == await expected_rows(store)  # every key once, in key order, no other
    assert listing.keys_listed == {kind: len(rows[kind]) for kind in KINDS}
    assert all(key in {k for kind in KINDS for k, _ in rows[kind]} for key in JUNK)
    # 4 x concurrency ranges per kind (accepted: 40 agents and 2 junk folders).
    assert listing.ranges_total == 4 * 12 and listing.ranges_resumed == 0
    assert progress[0] == (0, 48) and progress[-1] == (48, 48)
    assert [d for d, _ in progress] == sorted(d for d, _ in progress)


def test_merged_ranges_never_split_a_group_and_cover_any_key() -> None:
    groups = [f"accepted/v1/agent={a:04x}/" for a in range(10)]
    ranges = ranges_from_groups("accepted", groups, 4)
    assert len(ranges) == 4
    probes = [*JUNK, *(g + "x" for g in groups), *(g[:-1] for g in groups), *groups]
    for key in (p for p in probes if p.startswith("accepted/v1/")):
        assert sum(r.contains(key) for r in ranges) == 1, key
    for group in groups:  # a group's keys all lie in the range holding its first key
        holder = [r for r in ranges if r.contains(group + "\x01")]
        assert holder and holder[0].contains(group + "\U0010ffff"), group
    assert len(ranges_from_groups("accepted", [], 8)) == 1  # no agent yet: one range
    for r in ranges:  # its listing prefix holds every key of the range
        assert all(k.startswith(r.list_prefix) for k in probes if r.contains(k)), r
    assert ranges[1].list_prefix == "accepted/v1/agent=000"


def test_a_stored_plan_with_a_gap_is_refused() -> None:
    ranges = ranges_from_groups("accepted", [f"accepted/v1/agent={a}/" for a in range(4)], 3)
    ranges += ranges_from_groups("quarantine", [], 1) + ranges_from_groups("raw-blobs", [], 1)
    # A plan written before raw-bundles were listed (a resumed audit): one range of them.
    bundles = ranges_from_groups("raw-bundles", [], 1)
    assert parse_plan("plan", plan_json(ranges)) == ranges + bundles
    ranges += bundles
    assert parse_plan("plan", plan_json(ranges)) == ranges
    gap = plan_json(ranges).replace(
        b'"upper": "accepted/v1/agent=1/"', b'"upper": "accepted/v1/agent=0/"'
    )
    with pytest.raises(ListingPlanError, match="accepted range 1 must start at the end of range 0"):
        parse_plan("plan", gap)
    with pytest.raises(ListingPlanError, match=r"ranges\[0\].kind"):
        parse_plan("plan", b'{"version": 1, "ranges": [{"kind": "x"}]}')


def _range_of(part_key: str) -> str:
    """``<dir><kind>/<range>`` of a part named ``<range>-<part>-n<rows>[-final].parquet``."""
    return part_key[: part_key.rindex("/") + 6]


async def test_a_crashed_listing_resumes_without_listing_finished_ranges_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(audit_listing, "PART_KEYS", 50)
    inner = MemoryStore()
    await put_all(inner, world(agents=30, per_agent=20, blobs=500))
    crashing = HangAfterParts(inner, AUDIT_DIR, 25, hang=False)
    with pytest.raises(ExceptionGroup) as crash:
        await list_for_audit(crashing, AUDIT_DIR, concurrency=1, previous=BIG)  # one stream
    assert crash.group_contains(Crashed)  # falls at the same part every run
    before = {info.key: info.etag async for info in inner.list(AUDIT_DIR)}
    finished = {k for k in before if k.endswith("-final.parquet")}
    finished_ranges = {_range_of(k) for k in finished}
    unfinished_parts = {
        k for k in before if k.endswith(".parquet") and _range_of(k) not in finished_ranges
    }
    assert finished and unfinished_parts  # it crashed mid-range, with ranges done

    recorder = ListRecorder(inner)
    resumed = await list_for_audit(recorder, AUDIT_DIR, concurrency=2)
    assert resumed.ranges_resumed == len(finished)
    assert recorder.folder_lists == []  # the plan is read back, not made again
    part_lists = [call for call in recorder.lists if not call[0].startswith(AUDIT_DIR)]
    assert len(part_lists) == resumed.ranges_total - resumed.ranges_resumed
    after = {info.key: info.etag async for info in inner.list(AUDIT_DIR)}
    assert all(after[k] == etag for k, etag in before.items())  # parts kept as they were
    # An unfinished range continues after the last key of its last part.
    last_parts: dict[str, str] = {}  # unfinished range -> its last part
    for key in sorted(unfinished_parts):
        last_parts[_range_of(key)] = key
    last_keys = {await audit_listing._last_key(inner, k) for k in last_parts.values()}
    assert last_keys and last_keys <= {after_key for _prefix, after_key in part_lists}
    assert await read_parts(inner, resumed) == await expected_rows(inner)


async def test_audit_keys_skip_listing_parts_and_trim_deletes_the_audit_folders(
    clock: ManualClock,
) -> None:
    store = MemoryStore(clock=clock)
    ctx = await context(store, clock)
    starts = [1_000 + n for n in range(KEEP_AUDITS + 2)]
    for n, start in enumerate(starts):
        record = AuditRecord(audit_id=f"{n:08x}", started_at_unix_ns=start, owner_epoch=ctx.epoch)
        await create_audit(ctx, record)
        await store.put(keys.audit_listing_prefix(start, f"{n:08x}") + "plan.json", b"{}")
        await store.put(keys.audit_listing_prefix(start, f"{n:08x}") + "accepted/p.parquet", b"")
    records = [keys.audit_key(start, f"{n:08x}") for n, start in enumerate(starts)]
    assert await audit_keys(store) == records
    assert await trim_old_audits(ctx) == 2
    assert await audit_keys(store) == records[2:]
    left = {info.key async for info in store.list(keys.RECONCILER_AUDITS_PREFIX)}
    assert not any(
        k.startswith(keys.audit_folder(s, f"{n:08x}"))
        for n, s in enumerate(starts[:2])
        for k in left
    )
    assert len(left) == 3 * KEEP_AUDITS  # each kept audit: its record and its two files


def start_child(
    endpoint: str, bucket: str, *, part_keys: int, hang_after: int
) -> subprocess.Popen[bytes]:
    """`tests.reconciler.listing_child`: lists, then hangs after ``hang_after`` parts."""
    args = [endpoint, bucket, AUDIT_DIR, str(part_keys), str(hang_after)]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.reconciler.listing_child", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.s3
async def test_kill_9_mid_listing_resumes_to_the_uninterrupted_listing(
    ministack_server: RunningServer,
) -> None:
    bucket = fresh_bucket(ministack_server)
    store = S3Store(bucket=bucket, prefix="lm", endpoint_url=ministack_server.endpoint_url)
    try:
        await put_all(store, world(agents=30, per_agent=40, blobs=700), parallel=128)
        child = start_child(ministack_server.endpoint_url, bucket, part_keys=100, hang_after=8)
        try:
            assert child.stdout is not None
            # Bounded: a child that never announces is killed below, closing its stdout.
            line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 120)
            assert line == b"parts-written\n"
            os.kill(child.pid, signal.SIGKILL)
        finally:
            child.kill()
            child.wait(timeout=30)
            if child.stdout is not None:
                child.stdout.close()
        assert child.returncode == -signal.SIGKILL
        before = {info.key async for info in store.list(AUDIT_DIR)}
        finished = {k for k in before if k.endswith("-final.parquet")}
        assert finished and len(before - finished) > 1  # the plan, and unfinished parts

        recorder = ListRecorder(store)
        resumed = await list_for_audit(recorder, AUDIT_DIR, concurrency=2)
        assert resumed.ranges_resumed == len(finished) < resumed.ranges_total
        listed = [c for c in recorder.lists if not c[0].startswith(AUDIT_DIR)]
        assert len(listed) == resumed.ranges_total - resumed.ranges_resumed
        assert before <= {k for kind in KINDS for k in resumed.parts[kind]} | {
            AUDIT_DIR + "plan.json"
        }

        other = keys.audit_listing_prefix(1_700_000_000_000_000_001, "0123abcd")
        whole = await list_for_audit(store, other, concurrency=2)
        got, want = await read_parts(store, resumed), await read_parts(store, whole)
        assert got == want == await expected_rows(store)
        assert all(n == 1 for n in Counter(k for kind in KINDS for k, _ in got[kind]).values())
    finally:
        await store.close()


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
async def test_parts_from_an_inventory_hold_what_a_listing_holds(
    file_format: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_listing, "PART_KEYS", 64)  # several parts per kind
    store = MemoryStore()
    await put_all(store, world(agents=12, per_agent=9, blobs=150) + OUTSIDE)
    rows = [(f"prod/{i.key}", i.size, i.last_modified_ns, i.etag) async for i in store.list("")]
    root = tmp_path / "inventory"
    folder = "inventories/lm-source/daily"
    name = f"{folder}/data/part-0.{'csv.gz' if file_format == 'csv' else 'parquet'}"
    (root / name).parent.mkdir(parents=True)
    if file_format == "csv":
        text = "".join(
            f'"lm-source","{urllib.parse.quote_plus(k)}","{s}","{iso(m)}","{e.strip(chr(34))}"\n'
            for k, s, m, e in rows
        )
        (root / name).write_bytes(gzip.compress(text.encode()))
        schema = "Bucket, Key, Size, LastModifiedDate, ETag"
    else:
        columns = list(zip(*rows, strict=True))
        table = pa.table(
            {
                "key": pa.array(columns[0]),
                "size": pa.array(columns[1], pa.int64()),
                "last_modified_date": pa.array(
                    [m // 1_000_000 for m in columns[2]], pa.timestamp("ms")
                ),
                "e_tag": pa.array([e.strip('"') for e in columns[3]]),
            }
        )
        pq.write_table(table, root / name)
        schema = "message s3.inventory { }"
    manifest = {
        "sourceBucket": "lm-source",
        "creationTimestamp": "1759990000000",
        "fileFormat": "CSV" if file_format == "csv" else "Parquet",
        "fileSchema": schema,
        "files": [{"key": name}],
    }
    (root / folder / "2025-10-09T00-00Z").mkdir(parents=True)
    (root / folder / "2025-10-09T00-00Z" / "manifest.json").write_text(json.dumps(manifest))
    source = InventorySource.from_url(f"file://{root}", source_prefix="prod/")
    try:
        from_inventory = await parts_from_inventory(store, AUDIT_DIR, source)
    finally:
        await source.close()

    listed = await expected_rows(store)
    got = await read_parts(store, from_inventory)
    assert {k: [(key, f'"{e}"') for key, e in v] for k, v in got.items()} == listed
    assert from_inventory.keys_listed == {kind: len(listed[kind]) for kind in KINDS}
    assert from_inventory.list_requests == 0
    assert all(len(from_inventory.parts[kind]) > 1 for kind in ("accepted", "raw-blobs"))


def iso(unix_ns: int) -> str:
    return datetime.fromtimestamp(unix_ns / 1e9, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
