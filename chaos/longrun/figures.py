"""The long simulation's figures (`measure`), the claims issue 31 makes about them
(`shortfalls`), and how they print (`render`).

Every figure comes from the timeline (`chaos.longrun.watch.LongRunWatch`) and what the
run counted; a claim is judged only for what had its chance within the run (a batch whose
row landed less than two loop intervals before the end is not late yet), and each count
must reach the run's `chaos.longrun.config.Minimums`, so no claim passes on 0 of 0.

- Cataloging: every batch whose log row reached the store is cataloged within two loop
  intervals of that landing; batches whose rows were lost (kills, lost flushes) wait for
  an audit: counted, and each must be cataloged within two audit intervals.
- Orphans: at least 95 % of the planted orphans are deleted within two audit intervals
  of becoming deletable (LastModified + the GC's retry horizon).
- Collisions: catalog files the GC found gone but covered by a merged file it read
  (``gc_catalog_read_covered``), counted over every run.
- Raw retention: every blob of a retired hour is deleted within a day of its retirement.
- ``lm_reconciler_gc_stalled_total`` stays 0.
- Bounds: no log segment outlives its retention by more than two sweeps and two loop
  intervals; no ``catalog-created/`` entry outlives two audit intervals (plus ten loop
  intervals for the audits' own time and the GC run that trims).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chaos.longrun.config import DAY_S, LongRunConfig
from chaos.longrun.watch import BoundSample, LongRunWatch
from reconciler.daemon import LOG_SWEEP_INTERVAL_S

ORPHAN_SHARE = 0.95
SHOWN = 5  # examples of a shortfall shown
SAMPLES_SHOWN = 16  # rows of the bounds table printed (evenly spread; the last always)


@dataclass
class Figures:
    batches: int = 0
    steady_judged: int = 0
    steady_in_time: int = 0
    steady_late: list[str] = field(default_factory=list)
    steady_max_s: float = 0.0
    steady_p99_s: float = 0.0
    cataloged_by_audit_first: int = 0
    """Of the judged: cataloged by an audit before the steady pass got to them."""
    lost_rows: int = 0
    lost_rows_in_time: int = 0
    lost_rows_late: list[str] = field(default_factory=list)
    lost_rows_max_wait_s: float = 0.0
    orphans_planted: int = 0
    orphans_due: int = 0
    orphans_in_time: int = 0
    orphans_late: list[str] = field(default_factory=list)
    orphan_max_delay_s: float = 0.0
    """Deletion after becoming deletable, longest of the due ones deleted."""
    collisions: int = 0
    collision_runs: int = 0
    stalled: int = 0
    retired: int = 0
    retired_due: int = 0
    retired_in_time: int = 0
    retired_late: list[str] = field(default_factory=list)
    retired_max_delay_s: float = 0.0
    segments_written: int = 0
    segments_deleted: int = 0
    segment_age_bound_s: float = 0.0
    entries_deleted: int = 0
    entry_age_bound_s: float = 0.0
    samples: list[BoundSample] = field(default_factory=list)


def measure(
    watch: LongRunWatch,
    config: LongRunConfig,
    *,
    end_s: float,
    collisions: int,
    collision_runs: int,
    stalled: int,
) -> Figures:
    figures = Figures(
        collisions=collisions,
        collision_runs=collision_runs,
        stalled=stalled,
        samples=list(watch.samples),
        segments_written=watch.segments_landed,
        segments_deleted=watch.segments_deleted,
        entries_deleted=watch.entries_deleted,
        segment_age_bound_s=config.segment_retention_s
        + 2 * LOG_SWEEP_INTERVAL_S
        + 2 * config.loop_interval_s,
        entry_age_bound_s=2 * config.audit_interval_s + 10 * config.loop_interval_s,
    )
    _cataloging(figures, watch, config, end_s)
    _orphans(figures, watch, config, end_s)
    _retired(figures, watch, end_s)
    return figures


def _cataloging(figures: Figures, watch: LongRunWatch, config: LongRunConfig, end_s: float) -> None:
    bound_s = 2 * config.loop_interval_s
    waits: list[float] = []
    figures.batches = len(watch.created_s)
    for key, created in sorted(watch.created_s.items()):
        cataloged = watch.cataloged.get(key)
        landed = watch.row_landed_s.get(key)
        if landed is not None and landed <= end_s - bound_s:
            figures.steady_judged += 1
            wait = (cataloged[0] - landed) if cataloged else end_s - landed
            waits.append(max(0.0, wait))
            if cataloged is not None and cataloged[0] <= landed + bound_s:
                figures.steady_in_time += 1
                figures.cataloged_by_audit_first += cataloged[1] == "audit"
            else:
                figures.steady_late.append(f"{key}: row landed t={landed:.0f}s, waited {wait:.0f}s")
        elif landed is None and created <= end_s - 2 * config.audit_interval_s:
            figures.lost_rows += 1
            wait = (cataloged[0] - created) if cataloged else end_s - created
            figures.lost_rows_max_wait_s = max(figures.lost_rows_max_wait_s, wait)
            if cataloged is not None and wait <= 2 * config.audit_interval_s:
                figures.lost_rows_in_time += 1
            else:
                figures.lost_rows_late.append(
                    f"{key}: created t={created:.0f}s, waited {wait:.0f}s"
                )
    if waits:
        waits.sort()
        figures.steady_max_s = waits[-1]
        figures.steady_p99_s = waits[min(len(waits) - 1, int(0.99 * len(waits)))]


def _orphans(figures: Figures, watch: LongRunWatch, config: LongRunConfig, end_s: float) -> None:
    figures.orphans_planted = len(watch.orphans)
    for orphan in watch.orphans:
        deletable = orphan.planted_s + config.retry_horizon_s
        deadline = deletable + 2 * config.audit_interval_s
        if deadline > end_s:
            continue
        figures.orphans_due += 1
        deleted = watch.first_deleted_after(orphan.sha, orphan.planted_s)
        if deleted is not None and deleted <= deadline:
            figures.orphans_in_time += 1
            figures.orphan_max_delay_s = max(figures.orphan_max_delay_s, deleted - deletable)
        else:
            figures.orphans_late.append(
                f"{orphan.sha[:12]} (log row: {orphan.logged}) planted t={orphan.planted_s:.0f}s, "
                + ("never deleted" if deleted is None else f"deleted t={deleted:.0f}s")
            )


def _retired(figures: Figures, watch: LongRunWatch, end_s: float) -> None:
    for key, hour in watch.manifest_hour.items():
        retired = watch.retired_at(hour)
        if retired is None:
            continue
        figures.retired += 1
        if retired + DAY_S > end_s:
            continue
        figures.retired_due += 1
        deleted = watch.first_deleted_after(watch.manifest_sha[key], retired)
        if deleted is not None and deleted <= retired + DAY_S:
            figures.retired_in_time += 1
            figures.retired_max_delay_s = max(figures.retired_max_delay_s, deleted - retired)
        else:
            figures.retired_late.append(f"{key}: hour {hour.iso} retired t={retired:.0f}s")


def shortfalls(figures: Figures, config: LongRunConfig) -> list[str]:
    """Each claim of the module docstring that does not hold, as a sentence."""
    least = config.minimums
    found: list[str] = []

    def short(what: str, have: int, need: int) -> None:
        if have < need:
            found.append(f"only {have} {what} (at least {need} needed to prove anything)")

    short(
        "batches judged against the steady pass's bound",
        figures.steady_judged,
        least.steady_batches,
    )
    short("batches whose rows were lost", figures.lost_rows, least.lost_row_batches)
    short("orphans due", figures.orphans_due, least.orphans_due)
    short("collisions between compaction and the GC's reads", figures.collisions, least.collisions)
    short("retired raw blobs due", figures.retired_due, least.retired_due)
    short("log segments deleted", figures.segments_deleted, least.segments_deleted)
    if figures.steady_late:
        found.append(
            f"{len(figures.steady_late)} of {figures.steady_judged} batches were not cataloged "
            f"within 2 loop intervals of their log row landing: {figures.steady_late[:SHOWN]}"
        )
    if figures.lost_rows_late:
        found.append(
            f"{len(figures.lost_rows_late)} of {figures.lost_rows} batches whose rows were lost "
            f"waited more than 2 audit intervals: {figures.lost_rows_late[:SHOWN]}"
        )
    if figures.orphans_due and figures.orphans_in_time < ORPHAN_SHARE * figures.orphans_due:
        found.append(
            f"only {figures.orphans_in_time} of {figures.orphans_due} orphans were deleted within "
            f"2 audit intervals of becoming deletable: {figures.orphans_late[:SHOWN]}"
        )
    if figures.retired_late:
        found.append(
            f"{len(figures.retired_late)} of {figures.retired_due} retired raw blobs were not "
            f"deleted within a day: {figures.retired_late[:SHOWN]}"
        )
    if figures.stalled:
        found.append(f"lm_reconciler_gc_stalled_total = {figures.stalled}")
    for sample in figures.samples:
        if sample.segments and sample.oldest_segment_age_s > figures.segment_age_bound_s:
            found.append(
                f"t={sample.at_s:.0f}s: the oldest log segment is {sample.oldest_segment_age_s:.0f}s "
                f"old (bound {figures.segment_age_bound_s:.0f}s); {sample.segments} segments"
            )
        if sample.entries and sample.oldest_entry_age_s > figures.entry_age_bound_s:
            found.append(
                f"t={sample.at_s:.0f}s: the oldest catalog-created entry is "
                f"{sample.oldest_entry_age_s:.0f}s old (bound {figures.entry_age_bound_s:.0f}s); "
                f"{sample.entries} entries"
            )
    return found


def render(figures: Figures, config: LongRunConfig, *, wall_s: float, cpu_s: float) -> str:
    """The figures as the lines ``chaos/RESULTS.md`` records."""
    f = figures

    def pct(part: int, whole: int) -> str:
        return f"{100 * part / whole:.1f} %" if whole else "n/a"

    lines = [
        f"long run seed {config.seed}: {config.duration_s / 3600:.0f} simulated hours "
        f"in {wall_s:.1f} s of wall time ({cpu_s:.1f} s of CPU)",
        f"batches accepted: {f.batches}",
        f"steady pass: {f.steady_in_time} of {f.steady_judged} batches whose log row reached the "
        f"store cataloged within 2 loop intervals ({2 * config.loop_interval_s:.0f} s): "
        f"{pct(f.steady_in_time, f.steady_judged)}; wait p99 {f.steady_p99_s:.1f} s, max "
        f"{f.steady_max_s:.1f} s; {f.cataloged_by_audit_first} of them by an audit first",
        f"rows lost: {f.lost_rows} batches waited for an audit; {f.lost_rows_in_time} cataloged "
        f"within 2 audit intervals; longest wait {f.lost_rows_max_wait_s:.0f} s",
        f"orphans: {f.orphans_planted} planted, {f.orphans_due} due, {f.orphans_in_time} deleted "
        f"within 2 audit intervals of becoming deletable ({pct(f.orphans_in_time, f.orphans_due)});"
        f" longest after deletable {f.orphan_max_delay_s:.0f} s",
        f"collisions between compaction and the GC's reads: {f.collisions} files "
        f"(in {f.collision_runs} GC runs); lm_reconciler_gc_stalled_total = {f.stalled}",
        f"raw retention: {f.retired} blobs retired, {f.retired_due} due, {f.retired_in_time} "
        f"deleted within a day (longest {f.retired_max_delay_s:.0f} s after retiring)",
        f"log segments: {f.segments_written} written, {f.segments_deleted} deleted; "
        f"catalog-created entries deleted: {f.entries_deleted}",
        f"bounds: segment age <= {f.segment_age_bound_s:.0f} s, entry age <= "
        f"{f.entry_age_bound_s:.0f} s",
        "   t (h)  segments  oldest (h)  entries  oldest (h)  catalog files  markers  marks",
    ]
    stride = max(1, -(-len(f.samples) // SAMPLES_SHOWN))
    shown = f.samples[::stride] + ([f.samples[-1]] if (len(f.samples) - 1) % stride else [])
    lines += [
        f"  {s.at_s / 3600:6.1f}  {s.segments:8d}  {s.oldest_segment_age_s / 3600:10.1f}  "
        f"{s.entries:7d}  {s.oldest_entry_age_s / 3600:10.1f}  {s.catalog_files:13d}  "
        f"{s.work_markers:7d}  {s.gc_marks:5d}"
        for s in shown
    ]
    return "\n".join(lines)
