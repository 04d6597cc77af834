"""The collector's group commit from its settings (`collector.bundles.options`)."""

from __future__ import annotations

from collector.bundles.options import bundle_options
from collector.metrics import CollectorMetrics
from config import Settings
from config.ingest_settings import IngestSettings


def test_settings_make_the_bundler_limits_and_the_gate_decides() -> None:
    settings = Settings(
        ingest=IngestSettings(bundle_max_in_flight=3, bundle_max_bytes=1000, bundle_max_frames=7)
    )
    gate = {"on": False}
    options = bundle_options(settings, lambda: gate["on"], CollectorMetrics())
    assert options is not None
    limits = options.limits
    assert (limits.max_in_flight, limits.max_bytes, limits.max_frames) == (3, 1000, 7)
    # 2 x (5 s connect + 30 s read) would outlast the 10 s budget: half the budget
    assert limits.send_margin_s == 5.0
    assert not options.bundles(resend=False, ts_range=None, now_ns=0)
    gate["on"] = True
    assert options.bundles(resend=False, ts_range=None, now_ns=0)
    assert not options.bundles(resend=True, ts_range=None, now_ns=0)


def test_bundle_false_has_no_bundler() -> None:
    off = Settings(ingest=IngestSettings(bundle=False))
    assert bundle_options(off, lambda: True, CollectorMetrics()) is None


def test_points_older_than_retention_are_not_bundled() -> None:
    settings = Settings.model_validate({"rollup": {"retention_points_days": 1.0}})
    options = bundle_options(settings, lambda: True, CollectorMetrics())
    assert options is not None
    day_ns = 86_400 * 10**9
    now = 10 * day_ns
    assert options.bundles(resend=False, ts_range=(now - 3 * day_ns, now - day_ns // 2), now_ns=now)
    assert not options.bundles(
        resend=False, ts_range=(now - 3 * day_ns, now - 2 * day_ns), now_ns=now
    )
