"""The ``.py`` entry file for ``spark-submit``: ``lm-reconciler audit --engine spark``.

spark-submit owns the session (master, resources); this file runs the audit's Spark engine
(`reconciler.audit.engines.spark_run`) as the lease holder and exits with ``lm-reconciler``'s exit
codes. Its arguments are the settings flags (``--config PATH``); an ``audit`` argument is
accepted and ignored. From the repository root, on this machine::

    PYSPARK_PYTHON=$PWD/.venv/bin/python PYTHONPATH=$PWD .venv/bin/spark-submit \\
        --master 'local[2]' reconciler/audit/spark_entry.py --config reconciler.toml

On a cluster, ship the packages with the job (executors need the third-party
dependencies installed, or a packed environment via ``--archives``)::

    python -m rollup.job.pyfiles --audit --out dist/
    spark-submit --master spark://HOST:7077 --py-files dist/lightmetrics-audit.zip \\
        dist/audit_spark_entry.py --config reconciler.toml

The store must be one every executor reaches: ``s3://`` (or ``file://`` on a shared
filesystem); executors take its ``[store]`` url, endpoint and region from the driver.
"""

from __future__ import annotations

import sys
from pathlib import Path

# spark-submit runs this file as a script: from a checkout, make the repository
# importable; a copy beside a built zip takes the packages from ``--py-files``.
_REPO_ROOT = Path(__file__).resolve().parents[2]
if (_REPO_ROOT / "reconciler" / "audit" / "spark_entry.py").is_file() and str(
    _REPO_ROOT
) not in sys.path:
    sys.path.insert(0, str(_REPO_ROOT))

from reconciler.__main__ import main as reconciler_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    flags = [a for a in (sys.argv[1:] if argv is None else argv) if a != "audit"]
    return reconciler_main([*flags, "audit", "--engine", "spark"])


if __name__ == "__main__":
    sys.exit(main())
