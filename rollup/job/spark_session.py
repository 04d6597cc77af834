"""A local Spark session for ``lm-rollup run``: quiet, self-contained, cleaned up.

What `local_spark` arranges (the field notes in DESIGN.md explain each):
- Python workers run the current interpreter (``PYSPARK_PYTHON=sys.executable``), so
  executors import this repository's packages with the same dependencies;
- Spark binds loopback only (``SPARK_LOCAL_IP=127.0.0.1``), the web UI is off;
- log4j2 logs at ``warn`` through a generated properties file passed with
  ``spark.driver.extraJavaOptions`` (no INFO banner on every run);
- every scratch directory (``SPARK_LOCAL_DIRS``, ``java.io.tmpdir``, the log config) lives
  under one per-run temporary directory that is removed when the session stops;
- timestamps are UTC (``spark.sql.session.timeZone``) and Arrow is on;
- the JVM compiles with C1 only (``-XX:TieredStopAtLevel=1``): in this job it schedules
  tasks and moves a few Arrow IPC blobs, so C2 never pays for itself — it was most of the
  JVM's CPU (`bench.rollup`, 10M points: 1.2-1.7 s of C2 compiler threads per warm run,
  ~2.7 s in the first; with C1 the whole JVM used 0.8-1.0 s per warm run).

Under ``spark-submit`` none of this applies: `rollup.job.spark_entry` takes the session that
spark-submit configured (`submitted_spark`).

The environment variables are set only while the JVM starts and restored afterwards:
the JVM (and the workers it forks) keep the values they started with.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# log4j2 at warn, to stderr: the log config of every Spark JVM we start.
QUIET_LOG4J2 = """\
status = error
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yyyy-MM-dd'T'HH:mm:ss.SSS} %p %c{1}: %m%n%ex
# Known-harmless start-up warnings on a laptop or CI box:
logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
"""

# Settings every rollup session needs, local or submitted.
JOB_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # The shuffle carries small partial aggregates; AQE merges what little it is.
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.adaptive.coalescePartitions.enabled": "true",
    # Stage 1 ships partials as Arrow IPC blobs of up to ~15 MB: a small Arrow batch keeps
    # a batch of them under the 2 GiB limit of a binary column.
    "spark.sql.execution.arrow.maxRecordsPerBatch": "64",
}


@contextmanager
def local_spark(
    *,
    master: str,
    app_name: str = "lm-rollup",
    progress: bool = False,
    extra_conf: dict[str, str] | None = None,
) -> Iterator[SparkSession]:
    """Start a Spark session for this process and stop it (and remove its temporary
    directories) on exit; ``progress`` shows Spark's stage progress bar on stderr.
    Raises whatever Spark raises when it cannot start (no Java)."""
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        raise RuntimeError("a Spark session is already active in this process")
    scratch = Path(tempfile.mkdtemp(prefix="lm-rollup-spark-"))
    try:
        local_dirs = scratch / "local"
        java_tmp = scratch / "java-tmp"
        local_dirs.mkdir()
        java_tmp.mkdir()
        log_config = scratch / "log4j2.properties"
        log_config.write_text(QUIET_LOG4J2)
        java_options = (
            f"-Dlog4j2.configurationFile=file:{log_config} -Djava.io.tmpdir={java_tmp} "
            "-XX:-UsePerfData "  # no /tmp/hsperfdata_<user> left behind
            "-XX:TieredStopAtLevel=1"  # C1 only: see the module doc
        )
        builder = (
            SparkSession.builder.master(master)
            .appName(app_name)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "true" if progress else "false")
            .config("spark.driver.extraJavaOptions", java_options)
            .config("spark.executor.extraJavaOptions", java_options)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
        )
        for key, value in {**JOB_CONF, **(extra_conf or {})}.items():
            builder = builder.config(key, value)
        with _environment(
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOCAL_DIRS=str(local_dirs),
        ):
            spark = builder.getOrCreate()
        try:
            yield spark
        finally:
            spark.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def submitted_spark(app_name: str = "lm-rollup") -> SparkSession:
    """The session ``spark-submit`` configured (master, resources), plus `JOB_CONF`."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for key, value in JOB_CONF.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


@contextmanager
def _environment(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
