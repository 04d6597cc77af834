"""The rollup-dependent invariants, and whether the rollup can run here at all.

The rollup (``rollup/``, ``lm-rollup run``) needs PySpark and a Java runtime. When either
is missing, `rollup_unavailable` says why, and every
rollup check is reported ``skipped`` with that reason: never as passed.

Checks, against the latest committed snapshot:
- ``rollup_setsums``: per accepted hour, the ledger's batches, records and setsum equal
  those recomputed from the accepted manifests themselves (the authority, not the
  index); no ledger hour without accepted batches;
- ``rollup_catalog_setsums``: the same against the catalog's accepted rows (what the
  rollup planned from, `chaos.index_checks.catalog_setsums`);
- ``rollup_totals``: the ``rollup_1m`` table's total ``count`` and ``sum`` equal the
  ground truth: the point counts and finite value sums of the frames the store accepted,
  as the agents built them (every accepted frame must be one an agent sent), minus the
  points the snapshot's committed deletes mask (recomputed from the raw blobs, a bundled
  frame read by its range: `index.raw_reads.read_frame`);
- ``rollup_verify``: ``rollup.read.verify`` (what ``lm-rollup verify`` runs) finds every hour
  complete, from the catalog and ``--from-manifests``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING

from chaos.auditor import CheckResult, StoreView
from chaos.index_checks import catalog_setsums
from chaos.load import AckBook
from protocol.setsum import Setsum
from rollup.job.availability import why_job_unavailable
from store.base import ObjectStore

if TYPE_CHECKING:
    from rollup.table.manifest import LedgerHour, Snapshot

CHECK_NAMES = ("rollup_setsums", "rollup_catalog_setsums", "rollup_totals", "rollup_verify")


def rollup_unavailable() -> str | None:
    """``None`` when ``lm-rollup run`` can work here, else why not
    (`rollup.job.availability.why_job_unavailable`)."""
    reason = why_job_unavailable()
    return None if reason is None else f"rollup not available: {reason}"


def skipped(reason: str) -> list[CheckResult]:
    return [CheckResult.skipped(name, reason) for name in CHECK_NAMES]


async def rollup_checks(
    store: ObjectStore,
    view: StoreView,
    book: AckBook,
    *,
    store_url: str,
    endpoint_url: str,
) -> list[CheckResult]:
    from rollup.read.reader import rollup_1m_totals
    from rollup.read.verify import verify
    from rollup.table.commit import load_latest
    from rollup.table.storage import arrow_filesystem

    setsums = CheckResult("rollup_setsums")
    catalog = CheckResult("rollup_catalog_setsums")
    totals = CheckResult("rollup_totals")
    verified = CheckResult("rollup_verify")
    checks = [setsums, catalog, totals, verified]
    loaded = await load_latest(store)
    if loaded is None:
        if view.manifests:
            for check in checks:
                check.fail("no rollup snapshot was committed, but batches were accepted")
        return checks
    snapshot = loaded.snapshot

    expected: dict[str, tuple[int, int, Setsum]] = defaultdict(lambda: (0, 0, Setsum()))
    for manifest, _ in view.manifests.values():
        hour = manifest.accepted_hour.iso
        batches, record_count, setsum = expected[hour]
        expected[hour] = (
            batches + 1,
            record_count + manifest.record_count,
            setsum.add(manifest.identity.manifest_id, manifest.frame_sha256),
        )
    _compare_ledger(setsums, expected, snapshot.ledger_hours, "accepted")
    setsums.detail = f"version {snapshot.version}, {len(expected)} accepted hours"
    cataloged = catalog_setsums(view.catalog)
    _compare_ledger(catalog, cataloged, snapshot.ledger_hours, "cataloged")
    catalog.detail = f"version {snapshot.version}, {len(cataloged)} catalog hours"

    points = 0
    value_sum: list[float] = []
    for manifest, _ in view.manifests.values():
        facts = book.frames.get(manifest.frame_sha256)
        if facts is None:
            totals.fail(f"{manifest.manifest_key} holds a frame no agent sent")
            continue
        points += facts.point_count
        value_sum.append(facts.value_sum)
    masked_points, masked_sum = await _masked_by_deletes(store, view, snapshot)
    points -= masked_points
    value_sum.append(-masked_sum)
    truth_sum = math.fsum(value_sum)
    filesystem, root = arrow_filesystem(store_url, endpoint_url=endpoint_url)
    rolled_count, rolled_sum = await rollup_1m_totals(store, filesystem=filesystem, root=root)
    if rolled_count != points:
        totals.fail(f"rollup_1m counts {rolled_count} points, the accepted frames hold {points}")
    if not math.isclose(rolled_sum, truth_sum, rel_tol=1e-9, abs_tol=1e-6):
        totals.fail(f"rollup_1m sums to {rolled_sum!r}, the accepted frames to {truth_sum!r}")
    acked = {a.identity for a in book.acks}
    unacked = sum(1 for identity in view.manifests if identity not in acked)
    totals.detail = (
        f"{points} points in {len(view.manifests)} accepted batches "
        f"({unacked} accepted without an acknowledgement the agents saw; "
        f"{masked_points} masked by {len(snapshot.tombstones)} committed deletes)"
    )

    for source, from_manifests in (("catalog", False), ("manifests", True)):
        report = await verify(store, from_manifests=from_manifests)
        for hour_report in report.hours:
            if not hour_report.complete:
                verified.fail(f"{source}: hour {hour_report.hour}: {hour_report.describe()}")
        if report.unparseable_keys:
            verified.fail(f"{source}: {report.unparseable_keys} unparseable accepted manifests")
    verified.detail = f"version {report.version}, {len(report.hours)} hours, both sources"
    return checks


def _compare_ledger(
    check: CheckResult,
    expected: dict[str, tuple[int, int, Setsum]],
    ledger_hours: Mapping[str, LedgerHour],
    source: str,
) -> None:
    """Per hour: the ledger's batches, records and setsum against ``expected``."""
    for hour in sorted(set(expected) | set(ledger_hours)):
        batches, record_count, setsum = expected.get(hour, (0, 0, Setsum()))
        ledger = ledger_hours.get(hour)
        if ledger is None:
            check.fail(f"hour {hour}: {batches} {source} batches, no ledger entry")
        elif (ledger.batches, ledger.records, ledger.setsum) != (batches, record_count, setsum.hex):
            check.fail(
                f"hour {hour}: ledger has {ledger.batches} batches / {ledger.records} records / "
                f"setsum {ledger.setsum[:16]}, {source} {batches} / {record_count} / {setsum.hex[:16]}"
            )


async def _masked_by_deletes(
    store: ObjectStore, view: StoreView, snapshot: Snapshot
) -> tuple[int, float]:
    """Points (and their finite value sum) of the accepted frames that the snapshot's
    deletes mask in ``rollup_1m``, recomputed from the raw blobs themselves: the truth the
    table must equal is the frames' points minus these."""
    from index.raw_reads import BadRange, RawRef, read_frame
    from index.rows import FRAME_LENGTHS
    from protocol.frame import decode_frame
    from rollup.table.points import points_rows
    from rollup.table.tombstones import for_table, masked_in_rollup

    if not for_table(snapshot.tombstones, "rollup_1m"):
        return 0, 0.0
    count = 0
    sums: list[float] = []
    for manifest, _ in view.manifests.values():
        ref = RawRef.of_manifest(manifest)
        body = await read_frame(store, ref, max_frame_bytes=FRAME_LENGTHS[1])
        if isinstance(body, BadRange):  # the rollup left it out too: the totals will say
            raise ValueError(f"{manifest.manifest_key}: bad-range: {body.detail}")
        rows = points_rows(decode_frame(body))
        masked = rows.filter(masked_in_rollup(snapshot.tombstones, rows))
        count += masked.num_rows
        sums += [v for v in masked.column("value").to_pylist() if math.isfinite(v)]
    return count, math.fsum(sums)
