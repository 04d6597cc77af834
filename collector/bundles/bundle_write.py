"""Step 1 for every frame of a bundle: its one conditional PutObject (PROTOCOL §3.10).

`write_bundle` encodes the frames (`protocol.bundle.encode_bundle`, off the event loop)
and creates the bundle at `protocol.keys.raw_bundle_key` of its SHA-256 with
``If-None-Match: *`` through `ObjectStore.put`: one PutObject with the whole body, never a
multipart upload (only `ObjectStore.put_file` may switch to one, `store.s3_upload`; the
largest bundle is checked at load to fit one PutObject, `config.ingest_settings`). Its
outcome, for every frame in it:

- 200 → its ``blob`` row (key = the bundle) is appended to the index log, whatever comes
  next; every frame's manifest create then proceeds on its own (step 2);
- 412 → an identical bundle is there (or our own earlier attempt, whose answer was lost,
  landed): the §3.5 collector side runs on *the bundle's* key and hash
  (`collector.blob_survival.keep_existing_blob`: mark, veto, wait out a deletion, HEAD,
  re-create) before any of its frames' manifests is created;
- 409, 503, a timeout or an unknown outcome → the same bytes are sent again, bounded by
  the backoff and the earliest deadline of its frames. Repeating is safe: the key is the
  hash of the bytes, so every writer of it writes the same bytes, and If-None-Match
  makes a repeat either the create or a 412 (then the collector side proves it there);
- retries or the deadline run out → `BudgetExhausted`: every frame is answered 503
  (never 200 without its manifest). When an attempt's outcome was unknown, the bundle
  may exist: its ``blob`` row is appended first, so the GC finds it by time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from index.log_writer import IndexLogWriter
from index.rows import blob_row
from protocol.bundle import EncodedBundle, encode_bundle
from store.errors import ConditionConflict, OutcomeUnknown, PreconditionFailed, Unavailable

from ..blob_survival import keep_existing_blob
from ..store_calls import BudgetedRequest, BudgetExhausted


@dataclass(frozen=True, slots=True)
class WrittenBundle:
    """A bundle that is in the store (created, or proven there), and the store requests
    its write took."""

    bundle: EncodedBundle
    ops: int


async def write_bundle(
    request: BudgetedRequest,
    frames: Sequence[bytes],
    frame_sha256s: Sequence[str],
    *,
    collector_id: str,
    index_log: IndexLogWriter,
) -> WrittenBundle:
    """Encode and create the bundle of ``frames`` (their hashes as the collector computed
    them). ``request``'s deadline is the earliest of its frames'. Raises
    `BudgetExhausted` (every frame 503)."""
    bundle = await asyncio.to_thread(encode_bundle, list(frames), list(frame_sha256s))
    delays = request.delays()
    maybe_ours = False  # an attempt's answer was lost: it may have landed
    try:
        while True:
            try:
                await request.call(
                    "put_raw_bundle",
                    bundle.key,
                    lambda: request.store.put(bundle.key, bundle.data, if_none_match=True),
                )
                _index(request, index_log, bundle)
                return WrittenBundle(bundle, request.ops)
            except PreconditionFailed:
                break
            except OutcomeUnknown:
                maybe_ours = True
            except (ConditionConflict, Unavailable):
                pass
            await request.pause(delays)
    except BudgetExhausted:
        if maybe_ours:
            _index(request, index_log, bundle)
        raise
    if maybe_ours:
        _index(request, index_log, bundle)  # maybe ours: index it (idempotent)
    recreated = await keep_existing_blob(
        request, frame=bundle.data, sha=bundle.sha256, collector_id=collector_id, key=bundle.key
    )
    if recreated and not maybe_ours:
        _index(request, index_log, bundle)
    return WrittenBundle(bundle, request.ops)


def _index(request: BudgetedRequest, index_log: IndexLogWriter, bundle: EncodedBundle) -> None:
    index_log.append(blob_row(bundle.sha256, request.clock.now_ns(), bundle=True))
