"""``accepted_at_in_store_time``: every accepted manifest's ``accepted_at`` agrees with the
store's own clock (PROTOCOL §3.8), the auditor's check that a collector with a wrong clock
stamped nothing (the clock-skew scenario runs two, hours off).

Why the bounds hold: a collector stamps ``accepted_at`` at each manifest create, only while
its clock is within ``store.max_clock_skew_s`` of the store's (checked before the stamp),
and sends no create after its request's start + budget, so a create lands within the GC's
mark grace of its stamp (PROTOCOL §3.2, §3.5 rule 3: what the GC's safety rests on). With
LastModified in store time:

    LastModified - grace - skew - slack  <=  accepted_at  <=  LastModified + skew + slack

``slack`` covers LastModified's whole seconds and the collector measuring its skew from
the store's ``Date`` header (whole seconds too). A clock minutes or hours off breaks the
bounds at once; a correct one never comes near them.
"""

from __future__ import annotations

from collections.abc import Iterable

from chaos.auditor import CheckResult
from protocol import keys, records
from store.base import ObjectInfo

STAMP_SLACK_S = 2.0


def check_stamps(
    manifests: Iterable[tuple[records.AcceptedManifest, ObjectInfo]],
    *,
    max_clock_skew_s: float,
    grace_s: float,
) -> CheckResult:
    result = CheckResult("accepted_at_in_store_time")
    early_ns = int((grace_s + max_clock_skew_s + STAMP_SLACK_S) * keys.NS_PER_S)
    late_ns = int((max_clock_skew_s + STAMP_SLACK_S) * keys.NS_PER_S)
    checked = 0
    for manifest, info in manifests:
        checked += 1
        off_ns = manifest.accepted_at_unix_ns - info.last_modified_ns
        if not -early_ns <= off_ns <= late_ns:
            result.fail(
                f"{info.key}: accepted_at is {off_ns / keys.NS_PER_S:+.1f}s off its "
                f"LastModified (allowed -{early_ns / keys.NS_PER_S:g}s to "
                f"+{late_ns / keys.NS_PER_S:g}s): stamped by a clock that disagrees with the "
                "store's"
            )
    result.detail = f"{checked} manifests, store.max_clock_skew_s {max_clock_skew_s:g}"
    return result
