"""The ``.py`` entry file for ``spark-submit``: the same job as ``lm-rollup run``.

spark-submit owns the session (master, resources, logging); this file takes it, runs the
job once and exits with ``lm-rollup run``'s exit codes (see `rollup.__main__`).

From the repository root, on this machine::

    PYSPARK_PYTHON=$PWD/.venv/bin/python PYTHONPATH=$PWD \\
        .venv/bin/spark-submit --master 'local[2]' rollup/job/spark_entry.py --config rollup.toml

- ``PYSPARK_PYTHON``: the interpreter of the Python workers; it must have this project's
  dependencies (pyarrow, zstandard, pydantic, ...).
- ``PYTHONPATH``: makes the packages (``rollup``, ``protocol``, ``store``, ``config``)
  importable by the driver; local-mode workers inherit it.

On a cluster, ship the packages with the job instead (workers need the third-party
dependencies installed, or a packed environment via ``--archives``): `rollup.job.pyfiles`
builds the zip and puts a copy of this file beside it (deploy/spark/README.md)::

    python -m rollup.job.pyfiles --out dist/
    spark-submit --master spark://HOST:7077 --py-files dist/lightmetrics-rollup.zip \\
        dist/spark_entry.py --config rollup.toml

A ``run`` argument is accepted and ignored (``spark_entry.py --config X run`` reads like
``lm-rollup --config X run``).

``[rollup] spark_master`` is ignored here (``--master`` decides). The store must be one
every executor reaches: ``s3://`` (or ``file://`` on a shared filesystem).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

# spark-submit runs this file as a script: run from a checkout (rollup/job/spark_entry.py),
# make the repository importable when it was not put on PYTHONPATH. A copy beside a
# built zip (`rollup.job.pyfiles`) takes the packages from ``--py-files`` instead.
_REPO_ROOT = Path(__file__).resolve().parents[2]
if (_REPO_ROOT / "rollup" / "job" / "spark_entry.py").is_file() and str(_REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(_REPO_ROOT))

from config import SettingsError, configure_logging  # noqa: E402
from config.cli import add_settings_flags, settings_from_flags  # noqa: E402
from rollup.__main__ import EXIT_USAGE, quiet_spark_loggers, run_command  # noqa: E402
from rollup.job.spark_session import submitted_spark  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="spark_entry.py", description="lm-rollup run under spark-submit"
    )
    parser.add_argument("--progress", action="store_true", help="progress bars on stderr")
    parser.add_argument(
        "command", nargs="?", choices=["run"], help="optional, as in `lm-rollup run`"
    )
    add_settings_flags(parser)
    args = parser.parse_args(argv)
    try:
        settings = settings_from_flags(args)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(settings.logging)
    quiet_spark_loggers()
    spark = submitted_spark()
    try:
        return run_command(spark, settings, progress=args.progress)
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
