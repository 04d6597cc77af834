"""spark-submit entry file for the rollup job in the image.

``spark-submit [spark options] /opt/lightmetrics/rollup_entry.py --config PATH [run]``
runs `rollup.job.spark_entry.main`: the job of ``lm-rollup run`` on the session spark-submit
configured, so ``--master`` decides where it runs (``local[*]`` in the CronJob, a cluster
with ``--master k8s://...``: deploy/spark/README.md). spark-submit needs a ``.py`` file
rather than a console script; the project itself is installed in the image's venv.
"""

import sys

from rollup.job.spark_entry import main

if __name__ == "__main__":
    sys.exit(main())
