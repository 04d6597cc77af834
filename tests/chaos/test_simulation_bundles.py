"""The deterministic simulation with group commit on (PROTOCOL §3.10, issue 33 "Correctness"):
worlds whose collectors write bundles, each keeping every invariant (nothing acknowledged
lost or counted twice, the GC deletes only garbage, every record's raw object there and
holding its frame), and the mutants each of them flags.

A mutant is a bug put back on purpose (installed with ``monkeypatch`` for one test): the
test asserts the world reports a violation with it, and the same world's own test that it
reports none without it. Each world's seed was chosen as the first one (of a short scan)
whose world has the events its test counts and, for a mutant, ends in the violation
named in its docstring. When a change moves the seeded timing so that a world loses its
events (or a mutant its violation), the policy of `tests/chaos/test_simulation.py`'s
regression worlds applies: move to the first later seed that has them, and say so here.

Worlds without bundles are the worlds of before: nothing new draws from their seeds
(`chaos.sim.config.SimConfig.bundles` and the new knobs default off).

The GC's bundle mutants are also put back, one proof at a time, in
`tests/reconciler/test_gc_bundle_mutants.py`. Of them, a world here flags rule 7 skipping
a bundle's last frame (`BUNDLE_LANDING_WORLD`, at a seam of its own: the frames' identities
the proof reads). Trusting the index needs a bundle whose frames disagree with its index,
and the quarantine LIST skipping a frame a record naming a bundle, which no simulated
collector writes: worlds that plant those faults flag both, in
`tests/chaos/test_simulation_bundle_mutants.py`, as does one for raw retention checking
one frame of several: it needs a bundle whose frames retire apart, which the audit's
nomination (retired only when every row naming the bundle is) keeps from the proof unless a
frame's manifest lands after the audit, a fault planted there too.

The spool mutant (spool manifest creates of one identity sent concurrently) is flagged by
the local-spool world of `tests/chaos/test_simulation_spool.py`; the hypothesis worlds
here draw spool agents too (`chaos.sim.spool`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import collector.bundles.acceptance as bundle_acceptance
import collector.bundles.bundle_write as bundle_write
from chaos.sim.simulation import SimConfig, simulate
from collector.blob_survival import keep_existing_blob
from collector.bundles.bundle_write import WrittenBundle, write_bundle
from collector.store_calls import BudgetedRequest, BudgetExhausted
from index.log_writer import IndexLogWriter
from protocol import records
from protocol.bundle import encode_bundle, read_index
from protocol.keys import BatchIdentity
from reconciler.gc.proof import TargetedProof
from store.errors import StoreError

BUNDLED = SimConfig(
    seed=0,
    bundles=True,
    bundle_max_in_flight=1,  # a busy collector: the frames of the world's bursts bundle
    collectors=2,
    agents=4,
    send_window_s=1.0,
)
"""The shape of the bundle worlds: four agents' batches sent within a second to two
collectors with one raw write in flight each, so most frames are written in bundles."""

RACE_WORLD = dataclasses.replace(BUNDLED, seed=1, race_rate=1.0)
"""Every batch is raced by two collectors, each in a bundle of its own: the same frame
(one 200 new, one a duplicate whose bytes are dead) or half the time a conflicting one
(one 200, one 409 whose quarantine record names the accepted frame's copy, PROTOCOL
§3.10 "Records"). Seed 0 of this shape wrote no identity in two bundles; 1 is the first
with some, and with a bundle the GC deleted (every frame of it dead)."""

MIXED_STATES_WORLD = dataclasses.replace(
    BUNDLED,
    seed=32,
    race_rate=0.3,
    fault_rate=0.2,
    late_rate=0.2,
    agent_gone_rate=1.0,
)
"""Faults on a fifth of the collectors' writes, a fifth of them landing after their caller
gave up, and agents that never send a batch again once it was answered 503: bundles whose
frames end accepted, duplicate, conflicting and unknown to their agents, some whose
write's own outcome was unknown and given up (orphans the GC deletes). Seed 32 is the
first of 16-40 of this shape with a bundle in all four states whose world also flags
`late_manifests_of_a_given_up_bundle` (seeds 0-15 had either, never both)."""

BUNDLE_LANDING_WORLD = dataclasses.replace(BUNDLED, seed=1, bundle_landings=3)
"""Three orphan bundles (a collector crashed after writing them) whose frames are sent again
without the header to a collector that writes the same bundle (412): half of them once the
GC has marked the bundle, at a seeded moment within its grace plus the retry horizon (the
§3.5 collector side runs on the bundle while the GC may be proving or deleting it), half
as soon as an audit nominated it, through a collector that crashes before flushing its
log rows, so that only rule 7's reading of every frame's manifest keeps it; in half of
them the bundle's first frame was accepted before, elsewhere (dead bytes), so its last
frame alone names it (`chaos.sim.agents.SimAgents.bundle_landing`). Seed 1 is the first
of this shape that flags both mutants below: with `rule_7_skipping_the_last_frame`
t=44.423 s "GC deleted raw bundle e69f39a52da7: referenced by accepted/..." (seeds 1, 3
and 8 of 0-9); with `collector_side_on_the_frame_s_mark` t=30.136 s a manifest lands on
a bundle marked longer than the grace with no veto (every seed of 0-9)."""

RETENTION_BUNDLE_WORLD = dataclasses.replace(BUNDLED, seed=3, race_rate=0.3, raw_retention_s=20.0)
"""Raw retention with bundles (PROTOCOL §4.1, §3.10): the first hour retires, its bundles are
deleted whole by raw retention, acknowledged batches are re-sent (duplicates) or get a
conflicting twin once their bundle may be gone. Seed 3 is the first of this shape with
bundles deleted by raw retention and no violation (see `RETENTION_FINDING_WORLD`)."""

RETENTION_FINDING_WORLD = dataclasses.replace(RETENTION_BUNDLE_WORLD, seed=0)
"""Found by this world (fixed): a conflicting twin that arrives after raw retention deleted
the bundle holding the accepted frame gets a quarantine record naming the accepted frame's
frame blob (PROTOCOL §3.10: records name frame blobs only) with ``accepted_blob_present:
false``, a copy that was never made (the bundle's 404). The final audit reported
``missing-blob`` for that frame blob for ever: the accepted manifest's retired row names the
bundle, not the frame blob (with frame blobs both rows name one key, and a raw object a
retired row names is never missing). The audit now counts the quarantine's accepted side
as retired when its frame's accepted row is retired and names a bundle
(`reconciler.audit.engines.sql.REFERENCED`). Seeds 0, 6 and 7 of 0-7 found it."""

LATE_RESEND_AFTER_A_503_WORLD = SimConfig(
    seed=2,
    bundles=True,
    bundle_max_in_flight=1,
    collectors=1,
    agents=2,
    batches_per_agent=2,
    send_window_s=5.0,
    fault_rate=0.2,
    late_rate=0.0,
    agent_gone_rate=1.0,
    raw_retention_s=20.0,
    late_conflict_rate=0.0,
)
"""Found by the hypothesis bundle worlds at LM_SIM_WORLDS=500 (fixed, a wrong expectation
of the simulation): both late re-sends after raw retention deleted their raw objects were
answered 503 (the store's injected faults outlasted the 2 s budget, an allowed answer,
PROTOCOL §3.2 step 2) and, with ``agent_gone_rate``, their agent sent them once only, so
the check "a late re-send gets its 200" (§4.1: manifests stay, a re-send is a duplicate)
failed on a 503, not on an answer. Late re-sends now keep trying (`SimAgents.send`'s
``persistent``); both get their duplicate. The same world without bundles failed alike
(its frames were never bundled: one collector, two agents), and passes alike now."""

BUNDLE_WORLDS = max(1, int(os.environ.get("LM_SIM_WORLDS", "110")) // 25)  # 4 of 110


# --- the mutants ------------------------------------------------------------------------


def collector_side_on_the_frame_s_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    """The §3.5 collector side after a bundle's 412 reads (and vetoes) the mark of the
    bundle's first frame instead of the bundle's own (PROTOCOL §3.10 "The collector side
    on the right object"): a GC deleting the bundle never sees a veto or makes it wait."""
    real = keep_existing_blob  # what `bundle_write` calls

    async def frame_mark(
        request: BudgetedRequest,
        *,
        frame: bytes,
        sha: str,
        collector_id: str,
        key: str | None = None,
    ) -> bool:
        first_frame = read_index(frame).entries[0].frame_sha256
        return await real(request, frame=frame, sha=first_frame, collector_id=collector_id, key=key)

    monkeypatch.setattr(bundle_write, "keep_existing_blob", frame_mark)


def rule_7_skipping_the_last_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 7 for a bundle reads the manifests of every frame but the last (PROTOCOL §3.5
    rule 7, §3.10: "for **every** frame")."""
    real = TargetedProof._bundle_identities

    async def all_but_the_last(
        self: TargetedProof, sha: str, bundle_key: str, body: bytes
    ) -> list[BatchIdentity] | None:
        identities = await real(self, sha, bundle_key, body)
        return None if identities is None else identities[:-1]

    monkeypatch.setattr(TargetedProof, "_bundle_identities", all_but_the_last)


def late_manifests_of_a_given_up_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A collector that gave up on a bundle write whose outcome it did not know (every
    frame answered 503) keeps the frames, finds the bundle there on a later sweep (every
    15 s) and creates their manifests then: creates sent long past the frames' deadlines,
    landing after the GC's grace (PROTOCOL §3.2: never sent after accepted_at + budget;
    §3.5 rule 3). The agents of the world's batches answered 503 are gone, so a late
    create lands."""
    real = write_bundle  # what `bundle_acceptance` calls
    sweeps: set[asyncio.Task[None]] = set()

    async def later(request: BudgetedRequest, frames: Sequence[bytes], collector_id: str) -> None:
        bundle = encode_bundle(list(frames))
        for _ in range(4):
            await request.clock.sleep(15.0)
            try:
                await request.store.head(bundle.key)
            except StoreError:
                continue
            for frame, entry in zip(frames, bundle.entries, strict=True):
                manifest = records.AcceptedManifest.of_frame(
                    frame,
                    accepted_at_unix_ns=request.clock.now_ns(),
                    collector_id=collector_id,
                    bundle=(bundle.key, entry.offset),
                )
                try:
                    await request.store.put(
                        manifest.manifest_key, manifest.to_json(), if_none_match=True
                    )
                except StoreError:
                    pass
            return

    async def write_then_finish_later(
        request: BudgetedRequest,
        frames: Sequence[bytes],
        frame_sha256s: Sequence[str],
        *,
        collector_id: str,
        index_log: IndexLogWriter,
    ) -> WrittenBundle:
        try:
            return await real(
                request, frames, frame_sha256s, collector_id=collector_id, index_log=index_log
            )
        except BudgetExhausted:
            sweep = asyncio.ensure_future(later(request, frames, collector_id))
            sweeps.add(sweep)
            sweep.add_done_callback(sweeps.discard)
            raise

    monkeypatch.setattr(bundle_acceptance, "write_bundle", write_then_finish_later)


# --- the worlds, clean ------------------------------------------------------------------


def test_two_collectors_racing_one_identity_in_two_bundles() -> None:
    report = simulate(RACE_WORLD)
    assert report.ok, report.violations
    stats = report.stats
    assert stats["races"] > 0 and stats["races_conflicting"] > 0
    assert stats["identities_in_two_bundles"] > 0
    assert stats["bundled_duplicate"] > 0 and stats["bundled_conflict"] > 0  # dead bytes
    assert stats["bundles_deleted"] > 0  # a bundle of dead frames only: garbage, deleted


def test_a_bundle_whose_frames_end_in_mixed_states() -> None:
    report = simulate(MIXED_STATES_WORLD)
    assert report.ok, report.violations
    assert report.stats["bundles_all_states"] > 0  # accepted, duplicate, conflict, unknown


def test_an_orphan_bundle_written_again_survives_the_gc() -> None:
    report = simulate(BUNDLE_LANDING_WORLD)
    assert report.ok, report.violations
    stats = report.stats
    assert stats["bundle_landings_sent"] == 3 and stats["bundle_landings_before_mark"] > 0
    assert stats["vetoes_written"] > 0


def test_raw_retention_deletes_rolled_up_bundles_whole_and_nothing_else() -> None:
    report = simulate(RETENTION_BUNDLE_WORLD)
    assert report.ok, report.violations
    stats = report.stats
    assert stats["bundles_deleted_accepted"] > 0 and stats["gc_deleted_raw_retention"] > 0
    assert stats["late_conflicts"] > 0 and stats["identities_in_two_bundles"] > 0


def test_a_late_conflict_after_raw_retention_leaves_no_missing_blob() -> None:
    report = simulate(RETENTION_FINDING_WORLD)
    assert report.ok, report.violations


def test_a_late_re_send_after_raw_retention_gets_its_duplicate() -> None:
    report = simulate(LATE_RESEND_AFTER_A_503_WORLD)
    assert report.ok, report.violations
    stats = report.stats
    assert stats["late_resends_blob_gone"] == 2 and stats["gc_deleted_raw_retention"] > 0
    assert stats["answer_200_duplicate"] >= 2  # the late re-sends, raw objects gone


# --- the mutants, flagged ---------------------------------------------------------------


def test_the_collector_side_on_a_frame_s_mark_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    collector_side_on_the_frame_s_mark(monkeypatch)
    report = simulate(BUNDLE_LANDING_WORLD)
    assert any(
        "GC deleted raw bundle" in v or ("landed naming raw bundle" in v and "not vetoed" in v)
        for v in report.violations
    ), report.violations


def test_rule_7_skipping_a_frame_is_flagged(monkeypatch: pytest.MonkeyPatch) -> None:
    rule_7_skipping_the_last_frame(monkeypatch)
    report = simulate(BUNDLE_LANDING_WORLD)
    assert any("GC deleted raw bundle" in v for v in report.violations), report.violations


def test_a_late_manifest_create_from_a_given_up_bundle_is_flagged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    late_manifests_of_a_given_up_bundle(monkeypatch)
    report = simulate(MIXED_STATES_WORLD)
    assert any("landed naming raw bundle" in v and "not vetoed" in v for v in report.violations), (
        report.violations
    )


# --- many bundle worlds -----------------------------------------------------------------

bundle_worlds = st.builds(
    SimConfig,
    seed=st.integers(0, 2**32 - 1),
    bundles=st.just(True),
    bundle_max_in_flight=st.sampled_from([1, 2]),
    bundle_eager_frames=st.sampled_from([0, 2, 3]),
    collectors=st.integers(1, 3),
    agents=st.integers(2, 4),
    batches_per_agent=st.integers(2, 5),
    send_window_s=st.sampled_from([1.0, 5.0]),
    fault_rate=st.sampled_from([0.04, 0.2]),
    late_rate=st.sampled_from([0.0, 0.1]),
    race_rate=st.sampled_from([0.0, 0.5]),
    agent_gone_rate=st.sampled_from([0.0, 1.0]),
    bundle_landings=st.integers(0, 2),
    crash_landing_rate=st.sampled_from([0.0, 0.3]),
    raw_retention_s=st.sampled_from([None, 20.0]),
    late_conflict_rate=st.sampled_from([0.0, 0.2]),
    quarantined_bundles=st.integers(0, 1),
    bundles_unlike_index=st.integers(0, 1),
    bundles_retiring_apart=st.integers(0, 1),
    spool_agents=st.integers(0, 2),
)


@settings(
    max_examples=BUNDLE_WORLDS,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(config=bundle_worlds)
def test_simulated_worlds_with_bundles_keep_every_invariant(config: SimConfig) -> None:
    """Raw retention included, with late re-sends and conflicting twins, and the faults
    `chaos.sim.simulation.PlantedFaults` plants (their bundles must stay)."""
    report = simulate(config)
    assert report.ok, (config, report.violations)
