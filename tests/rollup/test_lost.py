"""``lm-rollup acknowledge-lost`` (issue 24 item 13): a batch whose raw blob is missing or
corrupt is never included, so its hour's ledger never matched the catalog and
``sealed_through_ns``, raw retention and ``verify`` stopped there for ever. Acknowledged,
it is a ledger row recorded as lost (who, why): catalog = included + lost, ``verify``
passes and lists it, the planner skips it, and what waited on the hour moves on. No
Spark: the included batches are committed as a run would (`dataset_builder`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from collector.query.coverage import first_uncovered_ns
from config import Settings
from config.settings import StoreSettings
from protocol import keys
from protocol.clock import ManualClock
from protocol.records import ProblemRecord
from rollup.cli.lifecycle import add_lifecycle_commands
from rollup.cli.read import add_read_commands
from rollup.job.plan import make_plan
from rollup.lifecycle.lost import NotLost, acknowledge_lost
from rollup.read.lost import acknowledged_shas
from rollup.read.verify import verify
from rollup.table.commit import load_latest
from rollup.table.ledger import LedgerRow, read_catalog_totals
from rollup.table.manifest_codec import snapshot_from_json
from rollup.table.owner import OwnerLease
from store.fs import FileSystemStore
from tests.rollup.conftest import DATA_START_NS, SentFrame, accept, make_frame
from tests.rollup.dataset_builder import commit_rows

S = 1_000_000_000
World = tuple[FileSystemStore, ManualClock, list[SentFrame]]


def run_cli(store: FileSystemStore, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    add_read_commands(commands)
    add_lifecycle_commands(commands)
    args = parser.parse_args(argv)
    code: int = args.handler(args, Settings(store=StoreSettings(url=store.url)))
    return code


HOUR = keys.UtcHour.from_unix_ns(DATA_START_NS)


def frame(seq: int) -> SentFrame:
    return make_frame(
        [(DATA_START_NS + seq * S, "cpu", 1.0, None)],
        seq_start=seq,
        accepted_at_ns=DATA_START_NS + seq * S,
    )


@pytest.fixture
async def world(tmp_path: Path) -> World:
    """Hour 0: four batches accepted and cataloged; the rollup included ``ok`` and
    ``late``; ``gone``'s blob was deleted and ``bent``'s overwritten: both stay pending,
    and the rollup recorded a problem for ``gone``'s blob as a run does."""
    clock = ManualClock(HOUR.shifted(3).start_ns)
    store = FileSystemStore(tmp_path / "store", clock=clock)
    ok, gone, bent, late = (frame(n) for n in range(4))
    await accept(store, [ok, gone, bent, late])
    await store.delete(gone.manifest.raw_blob_key)
    await store.put(bent.manifest.raw_blob_key, b"not the frame")
    problem = keys.problem_key("missing-blob", gone.manifest.raw_blob_key)
    await store.put(
        problem,
        ProblemRecord(
            kind="missing-blob",
            subject_key=gone.manifest.raw_blob_key,
            detail="the raw blob does not exist",
            first_seen_unix_ns=1,
            last_seen_unix_ns=1,
        ).to_json(),
    )
    owner = await OwnerLease.acquire(store, "job", 600, clock)
    rows = [LedgerRow.of_manifest(f.manifest) for f in (ok, late)]
    await commit_rows(store, owner, clock, ledger=rows)
    await owner.release()
    return store, clock, [ok, gone, bent, late]


async def test_acknowledged_batches_complete_their_hour(world: World) -> None:
    store, clock, (_ok, gone, bent, _late) = world
    before = await verify(store)
    assert not before.ok and before.hours[0].missing == 2
    # verify says what the hour waits for, and what settles it.
    waiting = {w.manifest_key: w for w in before.waiting}
    assert waiting[gone.manifest.manifest_key].problem == "missing-blob"
    assert waiting[bent.manifest.manifest_key].problem is None  # no run tried it yet
    assert "acknowledge-lost" in waiting[gone.manifest.manifest_key].describe()

    first = await acknowledge_lost(
        store, gone.manifest.manifest_key, reason="bucket restore failed", by="ops", clock=clock
    )
    second = await acknowledge_lost(
        store, bent.manifest.manifest_key, reason="corrupted on disk", by="ops", clock=clock
    )

    assert (first.version, second.version) == (2, 3)
    assert first.lost.problem == "missing-blob" and second.lost.problem == "corrupt-blob"
    assert "sha256 is" in second.lost.detail and second.lost.added_version == 3
    report = await verify(store)
    assert report.ok, report
    assert [b.manifest_id for b in report.lost] == [gone.manifest_id, bent.manifest_id]
    assert report.hours[0].lost.batches == 2 and report.waiting == ()
    assert "2 lost (2 records), acknowledged" in report.hours[0].describe()
    assert (await verify(store, from_manifests=True)).ok
    # The planner never plans them again; the audit does not report the blob missing.
    plan = await make_plan(store, await load_latest(store))
    assert plan.batches == 0
    assert await acknowledged_shas(store) == {gone.sha256, bent.sha256}
    assert not [i async for i in store.list(keys.RECONCILER_PROBLEMS_PREFIX)]
    # What compared the ledger with the catalog moves past the hour.
    latest = await load_latest(store)
    assert latest is not None
    catalog = {HOUR.iso: await read_catalog_totals(store, HOUR)}
    limit = HOUR.shifted(5).start_ns
    assert first_uncovered_ns(latest.snapshot, catalog, limit) == limit
    assert latest.snapshot.ledger_hours[HOUR.iso] == catalog[HOUR.iso]
    # Stored with who, why and per-hour totals, and read back the same.
    document = json.loads(latest.snapshot.to_json())
    lost = document["ledger"]["lost"][HOUR.iso]
    assert (lost["batches"], lost["records"]) == (2, 2)
    assert lost["acknowledged"][0]["by"] == "ops"
    assert lost["acknowledged"][0]["reason"] == "bucket restore failed"
    assert snapshot_from_json(latest.snapshot.to_json()) == latest.snapshot


async def test_refusals_change_nothing(world: World) -> None:
    store, clock, (ok, gone, _bent, _late) = world
    pointer = (await store.get(keys.ROLLUP_POINTER_KEY))[1]

    async def refused(key: str, match: str) -> None:
        with pytest.raises(NotLost, match=match):
            await acknowledge_lost(store, key, reason="x", by="ops", clock=clock)
        assert (await store.get(keys.ROLLUP_POINTER_KEY))[1] == pointer

    await refused(ok.manifest.manifest_key, "already in the ledger")
    await refused("accepted/v1/nonsense.json", "not an accepted manifest key")
    absent = frame(9)
    await refused(absent.manifest.manifest_key, "no accepted manifest")
    await store.put(absent.manifest.manifest_key, absent.manifest.to_json())
    await refused(absent.manifest.manifest_key, "not in catalog hour")
    intact = frame(10)
    await accept(store, [intact])
    await refused(intact.manifest.manifest_key, "is present and reads as batch")
    with pytest.raises(ValueError, match="reason"):
        await acknowledge_lost(store, gone.manifest.manifest_key, reason=" ", by="o", clock=clock)
    await acknowledge_lost(store, gone.manifest.manifest_key, reason="r", by="o", clock=clock)
    with pytest.raises(NotLost, match=r"already in the ledger .*acknowledged as lost"):
        await acknowledge_lost(store, gone.manifest.manifest_key, reason="r", by="o", clock=clock)


def test_cli_acknowledges_and_verify_lists_it(
    world: World, capsys: pytest.CaptureFixture[str]
) -> None:
    store, _clock, (_ok, gone, bent, _late) = world
    root = store
    assert (
        run_cli(
            root, "acknowledge-lost", gone.manifest.manifest_key, "--reason", "gone", "--dry-run"
        )
        == 0
    )
    assert "would record" in capsys.readouterr().err
    assert run_cli(root, "verify") == 1
    assert (
        f"waiting {HOUR.iso} {gone.manifest.manifest_key}: missing-blob" in capsys.readouterr().err
    )
    for sent in (gone, bent):
        code = run_cli(
            root, "acknowledge-lost", sent.manifest.manifest_key, "--reason", "r", "--by", "me"
        )
        assert code == 0
        out = capsys.readouterr().out
        assert json.loads(out[out.index("{\n") :])["by"] == "me"
    assert run_cli(root, "verify") == 0
    err = capsys.readouterr().err
    assert f"lost {HOUR.iso} {gone.manifest.manifest_key}: missing-blob" in err
    assert run_cli(root, "acknowledge-lost", gone.manifest.manifest_key, "--reason", "r") == 2
    assert "already in the ledger" in capsys.readouterr().err


async def test_a_bundled_batch_is_judged_by_its_range(world: World) -> None:
    """PROTOCOL §3.10: a bundled batch is read by its range (never its bundle whole as a
    frame, which would call an intact batch corrupt); one its bundle cannot serve is lost
    as ``bad-range``."""
    from protocol.bundle import encode_bundle
    from protocol.records import AcceptedManifest
    from tests.rollup.dataset_builder import catalog_manifests

    store, clock, _batches = world
    intact, stranger, other = frame(20), frame(21), frame(22)
    bundle = encode_bundle([intact.frame, other.frame])
    await store.put(bundle.key, bundle.data)
    manifests = []
    for sent, entry in ((intact, bundle.entries[0]), (stranger, bundle.entries[1])):
        manifest = AcceptedManifest.of_frame(
            sent.frame,
            accepted_at_unix_ns=sent.manifest.accepted_at_unix_ns,
            collector_id="c",
            bundle=(bundle.key, entry.offset),
        )
        if sent is stranger:  # names the bundle's other frame's range: no entry of its hash
            manifest = manifest.model_copy(
                update={"raw_length": entry.length, "frame_bytes": entry.length}
            )
        await store.put(manifest.manifest_key, manifest.to_json())
        manifests.append(manifest)
    await catalog_manifests(store, manifests, markers=False)

    await store.put(  # as a rollup run records it: the subject is the bundle
        keys.problem_key("bad-range", bundle.key),
        ProblemRecord(
            kind="bad-range",
            subject_key=bundle.key,
            detail="the bundle's index has no frame",
            first_seen_unix_ns=1,
            last_seen_unix_ns=1,
        ).to_json(),
    )
    waiting = {w.manifest_key: w for w in (await verify(store)).waiting}
    assert (
        waiting[manifests[1].manifest_key].blob_key,
        waiting[manifests[1].manifest_key].problem,
    ) == (bundle.key, "bad-range")
    with pytest.raises(NotLost, match="is present and reads as batch"):
        await acknowledge_lost(store, manifests[0].manifest_key, reason="r", by="o", clock=clock)
    done = await acknowledge_lost(store, manifests[1].manifest_key, reason="r", by="o", clock=clock)
    assert done.lost.problem == "bad-range" and "has no frame" in done.lost.detail
