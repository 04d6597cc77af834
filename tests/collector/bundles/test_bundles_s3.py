"""Group commit on a real S3 server (MiniStack): the bundle is one conditional PutObject
the store accepts and then refuses (412) for identical bytes, after which the §3.5
collector side proves the bundle with a HEAD; the manifests' ranges read back with
ranged GETs."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from chaos.s3_server import RunningServer, fresh_bucket
from collector.accept import Accepted
from index.raw_reads import RawRef, read_frame
from protocol import keys
from store.s3 import S3Store
from tests.collector.bundles.harness import BundleHarness, HeldStore, frames


@pytest.fixture
async def s3(ministack_server: RunningServer) -> AsyncIterator[S3Store]:
    store = S3Store(
        bucket=fresh_bucket(ministack_server),
        prefix="bundles",
        endpoint_url=ministack_server.endpoint_url,
        connect_timeout_s=2.0,
        read_timeout_s=30.0,
    )
    try:
        yield store
    finally:
        await store.close()


async def test_bundles_on_s3_are_created_once_and_read_back_by_range(s3: S3Store) -> None:
    first, *rest = frames(4)
    harness = BundleHarness(memory=HeldStore(s3), budget_s=20.0)
    answers = await harness.held_then_bundled(first, rest)
    assert all(isinstance(a, Accepted) and not a.duplicate for a in answers)
    (bundle_key,) = [info.key async for info in s3.list(keys.RAW_BUNDLES_PREFIX)]
    for frame in rest:
        manifest = await harness.manifest(frame)
        assert manifest.raw_blob_key == bundle_key and manifest.raw_range is not None
        ref = RawRef(bundle_key, manifest.frame_sha256, manifest.identity, *manifest.raw_range)
        assert await read_frame(s3, ref, max_frame_bytes=1 << 20) == frame

    # The same frames again, in the same order (new identities are not needed: the
    # manifests answer duplicates), make the identical bundle: S3 answers 412 and the
    # collector side proves it is there before any manifest is read.
    again = BundleHarness(memory=HeldStore(s3), budget_s=20.0)
    answers = await again.held_then_bundled(first, rest)
    assert all(isinstance(a, Accepted) and a.duplicate for a in answers)
    assert again.dead_bytes == 0  # the manifests name this very bundle
    names = again.op_names()
    assert ("put_raw_bundle", "precondition_failed") in again.ops
    assert names.index("head_raw_blob") < names.index("get_manifest", names.index("put_raw_bundle"))
