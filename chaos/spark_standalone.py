"""A real Spark standalone cluster on 127.0.0.1: one master and two workers, each its own
JVM started with ``spark-class`` (pyspark has no ``sbin/start-*.sh``; DESIGN.md field
notes), for tests and benchmarks that must run the rollup the way a cluster runs it
(``tests/rollup/test_spark_cluster.py``, ``bench.rollup_cluster``; imported by tests
through ``tests/rollup/spark_cluster.py``). It lives in this installed package, next to
`chaos.s3_server`, because benchmarks cannot import ``tests``.

What the cluster is given, and what it is not:

- each daemon starts in a new process group with a **clean environment**: ``PATH``,
  ``LANG``, ``SPARK_HOME`` (the pyspark package), ``SPARK_LOCAL_IP=127.0.0.1``, its own
  ``SPARK_LOCAL_DIRS``, quiet log4j2 and ``-Djava.io.tmpdir`` under its own directory, and
  the dummy AWS credentials (the "host's" credentials, as an instance profile would give
  them) — no ``PYTHONPATH``, no ``LM_*`` settings, nothing of the test process's;
- each daemon's working directory is its own directory under ``root``, never the
  repository, and each worker has its own ``--work-dir``: executors (children of the
  worker JVM, in its process group) run in ``<work-dir>/<app-id>/<executor-id>/`` and fetch
  ``--py-files`` there from the driver;
- `StandaloneCluster.stop` signals each daemon's process group by PID (workers first,
  so their executors and Python workers go with them), SIGTERM then SIGKILL after a bound.
  On Linux the daemons also get SIGTERM when the starting thread's process dies.

`start_cluster` returns once the master's ``/json`` page lists every worker ALIVE, or
raises `ClusterStartError` quoting the daemons' log tails after ``timeout_s``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.s3_server import child_env, die_with_parent_hook, dummy_aws_env
from rollup.job.spark_session import QUIET_LOG4J2

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
WORKER_CORES = 1
WORKER_MEMORY = "1g"


class ClusterStartError(RuntimeError):
    """The master or a worker exited or never registered; the message quotes the logs."""


@dataclass
class Daemon:
    """One master or worker JVM: its process (leader of its own process group) and log."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    work_dir: Path

    def log_tail(self, max_chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return "(no log)"

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM the process group (the JVM and whatever it started), SIGKILL after
        ``timeout_s``; the group is this daemon's alone (``start_new_session``)."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=timeout_s)
        # Executors outlive a worker killed hard: end the rest of its group too.
        _signal_group(self.process.pid, signal.SIGKILL)


@dataclass
class StandaloneCluster:
    """A running master and its workers; ``master_url`` is what ``--master`` takes."""

    root: Path
    master_url: str
    web_ui_url: str
    master: Daemon
    workers: list[Daemon] = field(default_factory=list)

    def state(self) -> dict[str, Any]:
        """The master's ``/json`` page: ``status``, ``aliveworkers``, ``workers``,
        ``activeapps``, ``completedapps``..."""
        return _get_json(f"{self.web_ui_url}/json")

    def worker_dirs(self) -> list[Path]:
        return [worker.work_dir for worker in self.workers]

    def log_tails(self) -> str:
        return "\n".join(
            f"--- {daemon.name} ({daemon.log_path}):\n{daemon.log_tail()}"
            for daemon in [self.master, *self.workers]
        )

    def stop(self) -> None:
        for daemon in [*self.workers, self.master]:
            daemon.stop()


def spark_home() -> Path:
    """The installed pyspark package: Spark's home (``bin/``, ``jars/``) in a pip install.
    Raises `ModuleNotFoundError` without pyspark (the ``[rollup]`` extra)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("pyspark is not installed (the [rollup] extra)")
    return Path(spec.origin).resolve().parent


def start_cluster(
    root: Path, *, workers: int = 2, timeout_s: float = START_TIMEOUT_S
) -> StandaloneCluster:
    """Start a master and ``workers`` workers under ``root`` (one directory each) and
    wait until all are registered. Stops whatever it started if that fails."""
    root.mkdir(parents=True, exist_ok=True)
    log_config = root / "log4j2.properties"
    log_config.write_text(QUIET_LOG4J2)
    master_port, ui_port = _free_port(), _free_port()
    master = _spawn(
        root,
        "master",
        log_config,
        [
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(master_port)),
            *("--webui-port", str(ui_port)),
        ],
    )
    cluster = StandaloneCluster(
        root=root,
        master_url=f"spark://127.0.0.1:{master_port}",
        web_ui_url=f"http://127.0.0.1:{ui_port}",
        master=master,
    )
    try:
        cluster.master_url = _wait_for(cluster, workers=0, deadline=time.monotonic() + timeout_s)
        for index in range(1, workers + 1):
            name = f"worker-{index}"
            work_dir = root / name / "work"
            work_dir.mkdir(parents=True)
            cluster.workers.append(
                _spawn(
                    root,
                    name,
                    log_config,
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        cluster.master_url,
                        *("--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY),
                        *("--host", "127.0.0.1", "--webui-port", str(_free_port())),
                        *("--work-dir", str(work_dir)),
                    ],
                    work_dir=work_dir,
                )
            )
        _wait_for(cluster, workers=workers, deadline=time.monotonic() + timeout_s)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def python_without_the_project(directory: Path) -> Path:
    """An executable that runs this interpreter as an executor host's Python would be:
    the third-party dependencies installed, this project not. The venv has the project
    installed in editable mode (a ``.pth`` file adds a finder that imports every package
    from the source tree, after ``sys.path``): a package missing from a shipped zip would
    be imported from there unnoticed. ``-S`` skips ``site`` and so every ``.pth`` file,
    and the venv's site-packages is put on ``PYTHONPATH`` instead (nothing in it shadows
    the standard library). Give it as ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON``."""
    directory.mkdir(parents=True, exist_ok=True)
    site_packages = sysconfig.get_paths()["purelib"]
    wrapper = directory / "python-without-the-project"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{site_packages}" exec {sys.executable} -S "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def spark_submit(
    master_url: str,
    work_dir: Path,
    arguments: list[str],
    *,
    extra_conf: dict[str, str] | None = None,
    timeout_s: float = 240.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``spark-submit --master MASTER_URL [conf] ARGUMENTS`` (client mode) and wait.

    It runs from ``work_dir/submit`` (outside the repository), with no ``PYTHONPATH``, and
    the driver's and executors' Python is `python_without_the_project`: the project is
    importable only from what ``ARGUMENTS`` ship (``--py-files``). Spark scratch, JVM
    temp files and the log config live under ``work_dir``. The driver waits for every
    executor of the cluster before it schedules anything, so all of them get tasks.
    The Python driver's stderr reaches the returned stdout (spark-submit merges them)."""
    scratch = work_dir / "submit"
    (scratch / "local").mkdir(parents=True, exist_ok=True)
    (scratch / "java-tmp").mkdir(exist_ok=True)
    log_config = scratch / "log4j2.properties"
    log_config.write_text(QUIET_LOG4J2)
    python = python_without_the_project(work_dir / "bin")
    java_options = (
        f"-Dlog4j2.configurationFile=file:{log_config} -Djava.io.tmpdir={scratch / 'java-tmp'} "
        "-XX:-UsePerfData -XX:TieredStopAtLevel=1"
    )
    env = child_env(
        {
            "SPARK_HOME": str(spark_home()),
            "PYSPARK_PYTHON": str(python),
            "PYSPARK_DRIVER_PYTHON": str(python),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(scratch / "local"),
        }
    )
    env.pop("PYTHONPATH", None)
    conf = {
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
        "spark.executor.extraJavaOptions": java_options,
        **(extra_conf or {}),
    }
    return subprocess.run(
        [
            str(spark_home() / "bin" / "spark-submit"),
            *("--master", master_url, "--deploy-mode", "client", "--name", "lm-rollup"),
            *(item for key, value in conf.items() for item in ("--conf", f"{key}={value}")),
            *("--driver-java-options", java_options),
            *arguments,
        ],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _spawn(
    root: Path, name: str, log_config: Path, argv: list[str], *, work_dir: Path | None = None
) -> Daemon:
    home = root / name
    java_tmp = home / "java-tmp"
    local_dirs = home / "local"
    for directory in (java_tmp, local_dirs):
        directory.mkdir(parents=True, exist_ok=True)
    java_options = (
        f"-Dlog4j2.configurationFile=file:{log_config} -Djava.io.tmpdir={java_tmp} "
        "-XX:-UsePerfData -XX:TieredStopAtLevel=1"  # as rollup.job.spark_session explains
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": str(home),
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(local_dirs),
        "SPARK_DAEMON_JAVA_OPTS": java_options,
        "SPARK_DAEMON_MEMORY": "256m",  # the daemons only schedule; executors get 1g
        **dummy_aws_env(),
    }
    if "JAVA_HOME" in os.environ:
        env["JAVA_HOME"] = os.environ["JAVA_HOME"]
    log_path = home / f"{name}.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *argv],
            env=env,
            cwd=home,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as one, by PID
            preexec_fn=die_with_parent_hook(),
        )
    return Daemon(name=name, process=process, log_path=log_path, work_dir=work_dir or home)


def _wait_for(cluster: StandaloneCluster, *, workers: int, deadline: float) -> str:
    """Poll the master's ``/json`` until it is ALIVE with ``workers`` ALIVE workers;
    returns the master URL it reports. Polling, not sleeping to pass: bounded."""
    last = "no answer yet"
    while time.monotonic() < deadline:
        for daemon in [cluster.master, *cluster.workers]:
            if daemon.process.poll() is not None:
                raise ClusterStartError(
                    f"{daemon.name} exited with status {daemon.process.returncode}\n"
                    + cluster.log_tails()
                )
        try:
            state = cluster.state()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            last = str(exc)
        else:
            alive = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
            if state.get("status") == "ALIVE" and len(alive) >= workers:
                return str(state["url"])
            last = f"status {state.get('status')}, {len(alive)} of {workers} workers alive"
        time.sleep(0.2)
    raise ClusterStartError(f"cluster not ready ({last})\n" + cluster.log_tails())


def _get_json(url: str) -> dict[str, Any]:
    # Loopback only: never through a configured HTTP proxy.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=2.0) as answer:
        document: dict[str, Any] = json.loads(answer.read())
        return document


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
