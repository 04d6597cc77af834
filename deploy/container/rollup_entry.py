"""spark-submit entry file for the rollup job.

``spark-submit [spark options] /opt/lightmetrics/rollup_entry.py --config PATH run`` runs
the same ``main`` as the ``lm-rollup`` console script (``rollup.__main__:main`` in
pyproject.toml); spark-submit needs a ``.py`` file rather than a console script.

LATER ISSUE: ``rollup.__main__`` is built in a later issue; until then this fails with
ModuleNotFoundError. When the rollup package ships its own entry file, point
deploy/kubernetes/rollup-cronjob.yaml and the Dockerfile at it and delete this one.
"""

import sys

from rollup.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
