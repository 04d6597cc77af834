"""Garbage collection of orphan raw blobs: mark, wait, veto, prove, delete (PROTOCOL §3.5).

Only raw objects are ever deleted — frame blobs and bundles (PROTOCOL §3.10), a bundle
only whole; manifests and quarantine records never are. A candidate is a raw object:
marks, vetoes and rules 1-6 are per object (a mark records its key), rule 2 matches rows
by raw key, and rule 7 checks every frame of a bundle. A raw object B is deleted only
when every rule of §3.5 holds, each checked where its module says:

- rule 3 (marked, then ``mark_grace``): `candidates` marks, `collector` waits;
- rules 1, 2, 4, 5 against the *rule-5 audit* — the latest completed listing audit (or,
  with ``gc.inventory_proves``, one read from an S3 Inventory report: then only for blobs
  older than the report by the horizon plus ``gc.inventory_lag_s``, and presence by a
  HEAD), which the daemon runs on schedule and **the GC never starts** (a candidate
  waits for the next one) — its orphan file, a HEAD after the mark unless the audit listed after
  it, the catalog files created since it started (`catalog_since`), vetoes: `deletion`;
- rule 7, the targeted proof (B read whole and checked whole, every frame's manifest in
  both agent key forms, one LIST of each quarantine prefix per form — of an identity for
  a frame blob, of an agent/boot pair for a bundle; raw retention's variant for the
  objects raw retention nominates): `proof`, after the grace and again after the mark
  turned ``deleting``;
- rule 6, one signed DELETE that cannot land after the lease the ``deleting`` mark
  recorded, judged by the literal ``X-Amz-Date`` + expiry, nothing signed while skewed:
  `delete`;
- the GC log, one Parquet file per run, written before the run removes the marks of the
  blobs it deleted: `log`; stale ``deleting`` and unreadable marks: `settle`; vetoes
  that did their work: `vetoes`.

Every delete goes through the GC role's store (blobs, marks, vetoes); `run` wires a run
to the reconciler (`run_gc`, `settle_stale_deletions`).
"""

from __future__ import annotations

from reconciler.gc.collector import GarbageCollector
from reconciler.gc.policy import GcOutcome, GcPolicy, GcRefused

__all__ = ["GarbageCollector", "GcOutcome", "GcPolicy", "GcRefused"]
