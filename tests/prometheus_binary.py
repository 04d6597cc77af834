"""The real Prometheus binary the read-path tests use (PROTOCOL §5): engine, sender and
reference. ``scripts/setup test`` installs Debian's package. Without it those tests skip,
except with ``CI=true``: there a missing binary is a failure, never a silent skip."""

from __future__ import annotations

import os
import shutil

import pytest

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
MISSING = (
    "the prometheus binary is not installed (scripts/setup test installs Debian's "
    "'prometheus' package; or: apt-get install prometheus)"
)


def require_prometheus() -> str:
    """The binary's path; skips the test without it, or fails it with ``CI=true``."""
    if PROMETHEUS is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(MISSING + "; CI=true: a read-path test may not skip")
        pytest.skip(MISSING)
    return PROMETHEUS
