"""Can the rollup job run here? One answer for every caller (``lm-demo``, ``lm-chaos``).

The reader (`rollup.read.reader`, ``lm-rollup query/history/verify/vacuum``) needs only
pyarrow; ``lm-rollup run`` also needs pyspark (the ``rollup`` extra) and a Java runtime.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

INSTALL_HINT = "install the rollup extra (scripts/setup rollup) and Java 17"


def why_job_unavailable() -> str | None:
    """``None`` when ``lm-rollup run`` can work on this machine, else the reason."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed"
    java_home = os.environ.get("JAVA_HOME")
    if shutil.which("java") is None and not (java_home and os.path.exists(f"{java_home}/bin/java")):
        return "no Java runtime (java is not on PATH and JAVA_HOME has none)"
    return None
