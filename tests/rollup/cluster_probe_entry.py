"""The ``spark-submit`` entry file of the cluster test: ``cluster_probe_entry.py REPORT
[spark_entry.py's arguments]``.

Before the job, it records where the driver and the executors import this project from
(a task per executor slot and then some, once every executor has registered) and writes
that to REPORT as JSON; then it runs the job exactly as ``spark_entry.py`` does
(`rollup.job.spark_entry.main`, imported from ``--py-files``) on the same session, and exits
with its code. The test copies it out of the repository before submitting it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from pyspark import SparkContext

PROJECT_MODULES = (
    "config",
    "index.catalog",
    "protocol.frame",
    "rollup.job.frame_stage",
    "rollup.job.hour_stage",
    "store.base",
)


def where_the_project_comes_from(_: object = None) -> dict[str, Any]:
    """Run on an executor (and on the driver): this process's view of the project."""
    import importlib

    files = {}
    for name in PROJECT_MODULES:
        module = importlib.import_module(name)
        files[name] = os.path.abspath(module.__file__ or "")
    return {
        "cwd": os.getcwd(),
        "pid": os.getpid(),
        "files": files,
        "sys_path": [os.path.abspath(p) for p in sys.path if p],
        "meta_path": [getattr(f, "__name__", type(f).__name__) for f in sys.meta_path],
        "pythonpath": os.environ.get("PYTHONPATH", ""),
    }


def main() -> int:
    report_path = Path(sys.argv.pop(1))
    context = SparkContext.getOrCreate()
    slots = 4
    executors = context.parallelize(range(slots), slots).map(where_the_project_comes_from).collect()
    report = {"driver": where_the_project_comes_from(), "executors": executors}
    report_path.write_text(json.dumps(report, indent=1))

    from rollup.job.spark_entry import main as run_the_job

    return run_the_job(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
