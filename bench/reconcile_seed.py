"""The store `bench.reconcile` audits: N accepted batches (raw blob + manifest, as
collectors leave them) and a catalog of them (one compacted file per hour, as the
reconciler leaves it), minus ``missing`` manifests whose catalog rows were "lost".

Seeding 2N objects by PUT would take most of an hour, so `seed_on_disk` writes MiniStack's
persistence directory before the server starts (S3_PERSIST=1): ``<S3_DATA_DIR>/<account>/
<bucket>/<key>`` holds the body and ``<key>.meta.json`` a JSON sidecar (content_type,
content_encoding, etag = quoted MD5, last_modified ISO 8601 ms ``Z``, size, metadata,
preserved_headers, storage_class, checksums ``CRC32`` = base64 of the big-endian CRC-32,
version_id, key) — the format ministack 1.5.33's ``services/s3.py`` writes on PutObject
and loads when its S3 service is first used. `spot_check` then reads a sample back
through the API.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import math
import os
import random
import time
import uuid
import zlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from index.rows import IndexRow, accepted_row, encode
from protocol import keys
from protocol.records import AcceptedManifest
from store.base import ObjectStore

MINISTACK_ACCOUNT = "000000000000"
"""MiniStack's account for credentials that are not a 12-digit account id (ours)."""
SPOT_CHECKS = 64


@dataclass(frozen=True, slots=True)
class Fleet:
    """``manifests`` accepted batches over ``agents`` x ``boots`` (agent-major order), each
    with a unique ``blob_bytes`` frame (the reconciler hashes frames, never decodes them),
    accepted between ``first_ns`` and ``first_ns + span_ns``."""

    manifests: int
    agents: int
    boots: int
    blob_bytes: int
    first_ns: int
    span_ns: int
    missing_every: int = 0
    """Every ``missing_every``-th manifest has no catalog row (0: none)."""

    @property
    def per_boot(self) -> int:
        return math.ceil(self.manifests / (self.agents * self.boots))

    @property
    def missing(self) -> int:
        return self.manifests // self.missing_every if self.missing_every else 0

    def batches(self) -> Iterator[tuple[int, AcceptedManifest, bytes]]:
        index = 0
        for agent in range(self.agents):
            for boot in range(self.boots):
                for seq in range(self.per_boot):
                    if index >= self.manifests:
                        return
                    yield index, *self._batch(agent, boot, seq, index)
                    index += 1

    def cataloged(self, index: int) -> bool:
        return not self.missing_every or (index + 1) % self.missing_every != 0

    def _batch(self, agent: int, boot: int, seq: int, index: int) -> tuple[AcceptedManifest, bytes]:
        stamp = f"lm-bench-reconcile agent={agent} boot={boot} seq={seq};".encode()
        frame = (stamp * (self.blob_bytes // len(stamp) + 1))[: self.blob_bytes]
        sha = hashlib.sha256(frame).hexdigest()
        manifest = AcceptedManifest(
            agent_id=f"bench-agent-{agent:05d}",
            boot_id=str(uuid.UUID(int=(agent << 32) | (boot + 1))),
            seq_start=seq * 10,
            seq_end=seq * 10 + 9,
            record_count=10,
            frame_sha256=sha,
            frame_bytes=len(frame),
            raw_blob_key=keys.raw_blob_key(sha),
            accepted_at_unix_ns=self.first_ns + index * self.span_ns // self.manifests,
            collector_id="bench-collector",
        )
        return manifest, frame

    def objects(self) -> Iterator[tuple[str, bytes]]:
        """Every object of the store: blobs, manifests, then the catalog files."""
        by_hour: dict[keys.UtcHour, list[IndexRow]] = defaultdict(list)
        for index, manifest, frame in self.batches():
            yield manifest.raw_blob_key, frame
            yield manifest.manifest_key, manifest.to_json()
            if self.cataloged(index):
                row = accepted_row(manifest)
                by_hour[row.hour].append(row)
        for sequence, (hour, rows) in enumerate(sorted(by_hour.items(), key=lambda kv: kv[0].iso)):
            yield keys.index_catalog_key(hour, 1, sequence + 1), encode(rows)


def _plain_key_ok(key: str) -> bool:
    # MiniStack stores a key at its own path only if every segment is non-empty, not "." or
    # "..", at most 200 bytes, and does not end in ".meta.json" or ".tmp".
    return all(
        part not in ("", ".", "..")
        and len(part.encode()) <= 200
        and not part.endswith((".meta.json", ".tmp"))
        for part in key.split("/")
    )


def seed_on_disk(bucket_dir: Path, fleet: Fleet) -> tuple[int, int, float]:
    """Write every object into MiniStack's persistence directory while it is not running.
    Returns (objects, bytes, seconds)."""
    modified = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    made: set[str] = set()
    objects = size = 0
    started = time.perf_counter()
    for key, body in fleet.objects():
        if not _plain_key_ok(key):
            raise ValueError(f"{key!r} is not a plain MiniStack key")
        path = os.path.join(bucket_dir, key)
        parent = os.path.dirname(path)
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        with open(path, "wb") as out:
            out.write(body)
        meta = {
            "content_type": "application/octet-stream",
            "content_encoding": None,
            "etag": f'"{hashlib.md5(body).hexdigest()}"',
            "last_modified": modified,
            "size": len(body),
            "metadata": {},
            "preserved_headers": {},
            "storage_class": "STANDARD",
            "checksums": {"CRC32": base64.b64encode(zlib.crc32(body).to_bytes(4, "big")).decode()},
            "version_id": None,
            "key": key,
        }
        with open(path + ".meta.json", "w") as out:
            out.write(json.dumps(meta))
        objects += 1
        size += len(body)
    return objects, size, time.perf_counter() - started


async def spot_check(store: ObjectStore, fleet: Fleet, rng: random.Random) -> int:
    """GET a sample of seeded blobs and manifests and compare bodies and ETags; raises on
    any mismatch. Returns how many objects were checked."""
    picks = set(rng.sample(range(fleet.manifests), min(SPOT_CHECKS, fleet.manifests)))
    checked = 0
    for index, manifest, frame in fleet.batches():
        if index not in picks:
            continue
        for key, body in (
            (manifest.raw_blob_key, frame),
            (manifest.manifest_key, manifest.to_json()),
        ):
            got, etag = await store.get(key)
            if got != body or etag.strip('"') != hashlib.md5(body).hexdigest():
                raise RuntimeError(f"seeded object {key!r} reads back different bytes or ETag")
            checked += 1
    return checked
