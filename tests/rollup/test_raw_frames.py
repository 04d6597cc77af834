"""Stage 1's raw reads (`rollup.job.raw_frames`, PROTOCOL §3.10): frame blobs whole as
before, a bundle whole or as coalesced ranges by how much of it a task wants, a bad
range as a ``bad-range`` read, and the GETs per batch of each."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from index.raw_reads import BadRange
from protocol.bundle import encode_bundle
from protocol.records import AcceptedManifest
from rollup.job.raw_frames import StoreRawSource, task_frames
from rollup.job.tasks import WORK_SCHEMA
from rollup.table.storage import StoreAccess
from store.fs import FileSystemStore
from tests.rollup.conftest import (
    DATA_START_NS,
    SentFrame,
    accept,
    assert_rollup_equal,
    committed_rollup,
    expected_rollup,
    make_frame,
    run,
)
from tests.rollup.dataset_builder import catalog_manifests

BOOT = uuid.UUID("00000000-0000-4000-8000-000000000007")
MAX = 1 << 20
S = 1_000_000_000


class Counted(StoreRawSource):
    """The executor's source, its requests counted by method."""

    def __init__(self, access: StoreAccess) -> None:
        object.__setattr__(self, "access", access)
        object.__setattr__(self, "calls", Counter())

    def get(self, key: str) -> bytes:
        self.calls["get"] += 1  # type: ignore[attr-defined]
        return super().get(key)

    def get_range(self, key: str, offset: int, length: int) -> bytes:
        self.calls["get"] += 1  # type: ignore[attr-defined]
        return super().get_range(key, offset, length)

    def size(self, key: str) -> int:
        self.calls["head"] += 1  # type: ignore[attr-defined]
        return super().size(key)


def _frames(count: int, agent: str = "agent-r") -> list[SentFrame]:
    return [
        make_frame(
            [(DATA_START_NS + i * 1_000, "m", float(j), {"j": str(j)}) for j in range(20)],
            agent_id=agent,
            boot_id=BOOT,
            seq_start=100 * i,
        )
        for i in range(count)
    ]


def _item(sent: SentFrame, **raw: Any) -> dict[str, Any]:
    return {
        "manifest_id": sent.manifest_id,
        "frame_sha256": sent.sha256,
        "raw_blob_key": raw.get("key", sent.manifest.raw_blob_key),
        "accepted_hour": sent.manifest.accepted_hour.iso,
        "record_count": sent.manifest.record_count,
        "raw_offset": raw.get("offset"),
        "raw_length": raw.get("length"),
        "raw_object_bytes": raw.get("size"),
    }


def _store(tmp_path: Path, key: str, body: bytes) -> None:
    path = tmp_path / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)


def _bundled(tmp_path: Path, frames: list[SentFrame], wanted: range) -> list[dict[str, Any]]:
    bundle = encode_bundle([f.frame for f in frames])
    _store(tmp_path, bundle.key, bundle.data)
    return [
        _item(frames[i], key=bundle.key, offset=e.offset, length=e.length, size=len(bundle.data))
        for i, e in enumerate(bundle.entries)
        if i in wanted
    ]


def _read(tmp_path: Path, items: list[dict[str, Any]]) -> tuple[dict[str, Any], Counter[str]]:
    source = Counted(StoreAccess(f"file://{tmp_path}"))
    table = pa.Table.from_pylist(items, schema=WORK_SCHEMA)
    got = {
        item["manifest_id"]: read for item, read in task_frames(source, table, max_frame_bytes=MAX)
    }
    return got, source.calls  # type: ignore[attr-defined]


def test_gets_per_batch_frame_blobs_against_a_bundle(tmp_path: Path) -> None:
    blobs = _frames(40, "agent-blob")
    for sent in blobs:
        _store(tmp_path, sent.manifest.raw_blob_key, sent.frame)
    got, calls = _read(tmp_path, [_item(s) for s in blobs])
    assert all(got[s.manifest_id] == s.frame for s in blobs)
    assert calls == {"get": 40}  # 1.0 GET per batch, as before

    bundled = _frames(40, "agent-bundle")
    got, calls = _read(tmp_path, _bundled(tmp_path, bundled, range(40)))
    assert all(got[s.manifest_id] == s.frame for s in bundled)
    assert calls == {"get": 1}  # the bundle whole: 1/40 GET per batch


def test_a_bundle_mostly_unwanted_is_read_as_coalesced_ranges(tmp_path: Path) -> None:
    frames = _frames(40)
    items = _bundled(tmp_path, frames, range(0, 40, 10))  # 4 of 40 frames, far apart
    items += _bundled(tmp_path, _frames(40, "agent-near"), range(5, 8))  # 3 adjacent
    got, calls = _read(tmp_path, items)
    assert all(got[frames[i].manifest_id] == frames[i].frame for i in range(0, 40, 10))
    # Another bundle's 3 adjacent frames are one ranged GET; the first bundle's 4 frames,
    # within COALESCE_GAP_BYTES of each other (small frames), one more.
    assert calls == {"get": 2}


def test_a_wrong_range_falls_back_and_an_absent_frame_is_a_bad_range(tmp_path: Path) -> None:
    frames = _frames(4)
    items = _bundled(tmp_path, frames, range(4))
    items[1]["raw_offset"], items[1]["raw_length"] = items[2]["raw_offset"], items[2]["raw_length"]
    stranger = _frames(5, "agent-x")[4]
    items[3] = {**items[3], "manifest_id": stranger.manifest_id, "frame_sha256": stranger.sha256}
    got, _calls = _read(tmp_path, items)
    assert got[frames[1].manifest_id] == frames[1].frame  # by the index entry of its hash
    bad = got[stranger.manifest_id]
    assert isinstance(bad, BadRange) and bad.kind == "bad-range"
    assert got[frames[0].manifest_id] == frames[0].frame


def test_a_range_longer_than_a_frame_may_be_is_refused_unread(tmp_path: Path) -> None:
    frames = _frames(2)
    items = _bundled(tmp_path, frames, range(2))
    items[0]["raw_length"] = MAX + 1
    got, calls = _read(tmp_path, items)
    assert isinstance(got[frames[0].manifest_id], BadRange)
    assert got[frames[1].manifest_id] == frames[1].frame
    assert calls == {"get": 1}  # frame 1's range only


async def test_a_rollup_over_frame_blobs_and_bundles_counts_every_frame_once(
    spark: SparkSession, fs_store: FileSystemStore
) -> None:
    """A store holding frame blobs and two bundles whose manifests (and catalog rows)
    carry ranges: the rolled-up points are the frames' points, nothing left out."""
    blobs = [make_frame(rows, agent_id="agent-old", boot_id=BOOT, seq_start=0)
             for rows in [[(DATA_START_NS + i * S, "cpu", float(i), {"h": "1"}) for i in range(30)]]]  # fmt: skip
    bundled = [
        make_frame(
            [
                (DATA_START_NS + (k * 7 + i) * S, "req", float(k + i), {"a": agent})
                for i in range(9)
            ],
            agent_id=agent,
            boot_id=BOOT,
            seq_start=10 * k,
        )
        for agent in ("agent-b1", "agent-b2")
        for k in range(5)
    ]
    await accept(fs_store, blobs, markers=False)
    manifests = [s.manifest for s in blobs]
    for group in (bundled[:5], bundled[5:]):
        bundle = encode_bundle([s.frame for s in group])
        await fs_store.put(bundle.key, bundle.data, if_none_match=True)
        for sent, entry in zip(group, bundle.entries, strict=True):
            manifest = AcceptedManifest.of_frame(
                sent.frame,
                accepted_at_unix_ns=sent.manifest.accepted_at_unix_ns,
                collector_id="test-collector",
                bundle=(bundle.key, entry.offset),
            )
            await fs_store.put(manifest.manifest_key, manifest.to_json())
            manifests.append(manifest)
    await catalog_manifests(fs_store, manifests)

    summary = await run(spark, fs_store)

    assert summary.outcome == "committed" and summary.problems == [], summary
    everything = blobs + bundled
    assert summary.batches == len(everything)
    assert summary.points == sum(s.manifest.record_count for s in everything)
    assert_rollup_equal(await committed_rollup(fs_store), expected_rollup(everything))
