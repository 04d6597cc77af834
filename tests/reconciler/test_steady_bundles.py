"""The steady pass over a bundle's log rows (PROTOCOL §3.7, §3.10): a bundle write's
``blob`` row names the bundle and its hash, the frames' ``accepted`` rows carry their
ranges into the catalog as they are (own creates: no request), and the raw object a
record row names, not its frame's hash, clears the bundle as an orphan suspect."""

from __future__ import annotations

from index.rows import accepted_row, blob_row
from protocol import keys
from protocol.clock import ManualClock
from reconciler.steady import SteadyScanner
from store.memory import MemoryStore
from tests.reconciler.conftest import T0_NS, catalog_rows, context, log_rows, make_batch
from tests.reconciler.test_audit_bundles import write_bundle

S = keys.NS_PER_S


async def test_bundle_rows_are_cataloged_with_ranges_and_clear_their_suspect(
    memory_store: MemoryStore, clock: ManualClock
) -> None:
    live = [make_batch(1, seq, T0_NS + seq * S) for seq in range(3)]
    live_key, _size, manifests = await write_bundle(memory_store, live, named=3)
    orphan = [make_batch(2, seq, T0_NS + seq * S) for seq in range(2)]
    orphan_key, _size, _ = await write_bundle(memory_store, orphan, named=0)
    rows = [
        blob_row(keys.parse_raw_bundle_key(key), T0_NS + S, bundle=True)
        for key in (live_key, orphan_key)
    ]
    for manifest in manifests:
        _body, etag = await memory_store.get(manifest.manifest_key)
        rows.append(accepted_row(manifest, etag=etag, own_create=True))
    await log_rows(memory_store, clock, [], rows=rows, writer_id="c1")
    scanner = SteadyScanner(await context(memory_store, clock))

    await scanner.run_pass()

    cataloged = await catalog_rows(memory_store)
    assert {k: (r.raw_blob_key, r.raw_offset, r.raw_length) for k, r in cataloged.items()} == {
        m.manifest_key: (live_key, m.raw_offset, m.raw_length) for m in manifests
    }
    suspects = scanner.suspects.take_older_than(T0_NS + 2 * S)
    assert suspects == [(keys.parse_raw_bundle_key(orphan_key), T0_NS + S, orphan_key)]
