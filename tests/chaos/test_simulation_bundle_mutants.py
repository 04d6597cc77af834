"""The deterministic simulation with bundles (PROTOCOL §3.10, issue 33 "Correctness"):
worlds with a fault planted in the store that no correct writer leaves, each flagging a
GC mutant of `tests/reconciler/test_gc_bundle_mutants.py` that the worlds of
`tests/chaos/test_simulation_bundles.py` (whose shape, `BUNDLED`, they share) cannot.

Each planted fault (`chaos.sim.simulation.PlantedFaults`) is a bundle (an orphan: a collector
crashed after writing it; or, with raw retention, one of the first hour) and, once an audit
nominated it for the GC, a record naming it that lands through a collector that crashed
before flushing its log rows: known to the store alone, so only the GC's targeted proof
(PROTOCOL §3.5 rule 7, §4.1 for raw retention) keeps the bundle. Two of the three need the
record to land past the mark's grace without a veto (an audit that lists it keeps the
bundle from the proof), so the planted writer breaks rule 3's premise too: the watch counts
that (``planted_past_the_grace``) instead of reporting it; the GC's safety (no raw object
deleted while a record names it, or before raw retention's rule allows) is checked as in
every world.
Each world's own test asserts it reports no violation without the mutant (the planted
records are excused from the end state: they are the fault); the mutant's test that the
same world reports the GC deleting a referenced bundle. Seeds are chosen as in
`tests/chaos/test_simulation_bundles.py`: the first of a short scan whose world has the
events its test counts and flags its mutant.
"""

from __future__ import annotations

import contextvars
import dataclasses

import pytest

import reconciler.gc.proof as proof_module
from chaos.sim.simulation import simulate
from protocol import keys, records
from reconciler.gc.proof import Proof, TargetedProof
from tests.chaos.test_simulation_bundles import BUNDLED, RETENTION_BUNDLE_WORLD
from tests.reconciler.test_gc_bundle_mutants import check_bundle_trusting_the_index

QUARANTINED_BUNDLE_WORLD = dataclasses.replace(BUNDLED, seed=0, quarantined_bundles=2)
"""Two orphan bundles, each named as the accepted blob by a quarantine record of its last
frame (not well-formed, PROTOCOL §3.10) that lands just after the audit that started past
the bundle's mark grace completed, before the GC's proof: an audit that listed it would
report it and the GC would then delete nothing at all (as rule 5 does), so rule 7's
quarantine LIST is the only thing between the record and the deletion, and the writer
breaks rule 3's premise too (it lands past the grace without a veto; counted, excused).
Seed 0 is the first of this shape (every seed of 0-5 alike) that flags
`quarantine_list_skipping_the_last_frame`: t=43.996 s "GC deleted raw bundle 8b9679dc75f2
referenced by quarantine/v1/identity-conflict/..." (and the other bundle at 45.395 s)."""

BUNDLE_UNLIKE_ITS_INDEX_WORLD = dataclasses.replace(BUNDLED, seed=3, bundles_unlike_index=2)
"""Two orphan bundles whose middle frame is another valid frame of the same length than
the one its index entry names (CRC of the index intact), each named by a well-formed
manifest of the indexed frame at that entry's range, landing within the first half of the
bundle's mark grace (rule 3's premise holds). The proof parses the frames: ``corrupt-blob``,
never deleted; found through the index, the frame there has another identity, whose
manifest is absent. Seed 3 is the first of 0-3 that flags `rule_7_trusting_the_index`:
t=42.225 s "GC deleted raw bundle 05afa65c05ad: referenced by accepted/..." (in seeds 0-2
the GC, mutant or not, did not delete the bundles once their manifests had landed)."""


BUNDLES_RETIRING_APART_WORLD = dataclasses.replace(
    RETENTION_BUNDLE_WORLD, seed=0, bundles_retiring_apart=2
)
"""Raw retention with two bundles of the first hour whose second frame's manifest (a create
whose outcome its writer did not know, sent past its deadline) lands once raw retention
nominated the bundle for its first frame, rolled up: just after the audit that started past
the mark's grace, before the GC's proof (earlier, the audit would list it and raw retention
would nominate the bundle no more: why no world without the fault flags the mutant). When
the proof comes first the bundle goes whole, rightly, and nothing lands
(``bundles_retiring_apart_gone``). Seed 0 is the first of this shape with a late manifest
on a bundle still there that flags `raw_retention_checking_one_frame` (seeds 0 and 7 of
0-7): t=128.879 s "GC deleted raw bundle ae2413d14035: accepted/... is not in the latest
rollup ledger"."""

# --- the mutants ------------------------------------------------------------------------


def quarantine_list_skipping_the_last_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 7's quarantine LIST for a bundle reads the records of every frame's identity
    but the last's (PROTOCOL §3.5 rule 7, §3.10: "no quarantine record of that identity
    names this object", for every frame)."""
    real_identities, real_quarantines = TargetedProof._bundle_identities, TargetedProof._quarantines
    last: dict[str, keys.BatchIdentity] = {}

    async def identities(
        self: TargetedProof, sha: str, bundle_key: str, body: bytes
    ) -> list[keys.BatchIdentity] | None:
        found = await real_identities(self, sha, bundle_key, body)
        if found:
            last[bundle_key] = found[-1]
        return found

    async def all_but_the_last(
        self: TargetedProof,
        raw_key: str,
        sha: str,
        prefixes: list[str],
        wanted: set[str],
        *,
        bundle: bool,
    ) -> Proof:
        if bundle and raw_key in last:
            wanted = wanted - set(keys.quarantine_identity_prefixes(last[raw_key]))
        return await real_quarantines(self, raw_key, sha, prefixes, wanted, bundle=bundle)

    monkeypatch.setattr(TargetedProof, "_bundle_identities", identities)
    monkeypatch.setattr(TargetedProof, "_quarantines", all_but_the_last)


def rule_7_trusting_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 7 finds a bundle's frames through its index instead of parsing them end to end
    (PROTOCOL §3.10: they "must tile the data part exactly, equal the index's entries")."""
    monkeypatch.setattr(proof_module, "check_bundle", check_bundle_trusting_the_index)


def raw_retention_checking_one_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """Raw retention's proof for a bundle shows only the first of the frames naming it
    rolled up (PROTOCOL §3.10: deleted "once every frame whose manifest names it is in the
    latest ledger as included")."""
    real_manifests, real_rolled_up = TargetedProof._manifests, TargetedProof._rolled_up
    shown: contextvars.ContextVar[int] = contextvars.ContextVar("shown", default=0)

    async def manifests(
        self: TargetedProof,
        raw_key: str,
        identities: list[keys.BatchIdentity],
        *,
        by_retention: bool,
    ) -> Proof:
        shown.set(0)  # one proof (each runs in its own task or after the last)
        return await real_manifests(self, raw_key, identities, by_retention=by_retention)

    async def first_only(self: TargetedProof, manifest: records.AcceptedManifest) -> bool:
        shown.set(shown.get() + 1)
        return await real_rolled_up(self, manifest) if shown.get() == 1 else True

    monkeypatch.setattr(TargetedProof, "_manifests", manifests)
    monkeypatch.setattr(TargetedProof, "_rolled_up", first_only)


# --- the worlds, clean ------------------------------------------------------------------


def test_a_quarantine_record_naming_a_bundle_keeps_it() -> None:
    report = simulate(QUARANTINED_BUNDLE_WORLD)
    assert report.ok, report.violations
    assert report.stats["quarantined_bundles_named"] == 2
    assert report.stats["planted_past_the_grace"] == 2  # after the audit: the proof decides


def test_a_bundle_unlike_its_index_is_never_deleted() -> None:
    report = simulate(BUNDLE_UNLIKE_ITS_INDEX_WORLD)
    assert report.ok, report.violations
    assert report.stats["bundles_unlike_index_named"] == 2


# --- the mutants, flagged ---------------------------------------------------------------


def test_the_quarantine_list_skipping_a_frame_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    quarantine_list_skipping_the_last_frame(monkeypatch)
    report = simulate(QUARANTINED_BUNDLE_WORLD)
    assert any(
        "GC deleted raw bundle" in v and "referenced by quarantine/" in v for v in report.violations
    ), report.violations


def test_rule_7_trusting_the_index_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    rule_7_trusting_the_index(monkeypatch)
    report = simulate(BUNDLE_UNLIKE_ITS_INDEX_WORLD)
    assert any(
        "GC deleted raw bundle" in v and "referenced by accepted/" in v for v in report.violations
    ), report.violations


def test_raw_retention_keeps_a_bundle_with_a_frame_not_rolled_up() -> None:
    report = simulate(BUNDLES_RETIRING_APART_WORLD)
    assert report.ok, report.violations
    stats = report.stats
    assert stats["bundles_retiring_apart_late"] > 0 and stats["gc_deleted_raw_retention"] > 0


def test_raw_retention_checking_one_frame_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    raw_retention_checking_one_frame(monkeypatch)
    report = simulate(BUNDLES_RETIRING_APART_WORLD)
    assert any(
        "GC deleted raw bundle" in v and "is not in the latest rollup ledger" in v
        for v in report.violations
    ), report.violations
