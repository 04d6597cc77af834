"""Root fixtures: dummy AWS credentials for every test, local S3 servers, and logging left
as each test found it (`restore_logging`).

The servers are session-scoped (one MiniStack, one moto, started on first use and
stopped by PID at the end); tests isolate themselves with a fresh bucket each
(`ministack_bucket`, `moto_bucket`, or `tests.s3_servers.fresh_bucket(server)`). So is
the one local Spark session (`spark`): Spark allows one per process, and every test
that needs one (the rollup's, the audit's Spark engine, the PromQL differential run)
shares it, in whatever order a run (or a pytest-xdist worker) takes the modules.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
import structlog

from config.cli import LOGGING_ENV
from tests.s3_servers import (
    AWS_ENV_TO_REMOVE,
    RunningServer,
    dummy_aws_env,
    fresh_bucket,
    start_ministack,
    start_moto,
)

if TYPE_CHECKING:
    from _pytest.terminal import TerminalReporter
    from pyspark.sql import SparkSession

TERMINAL_REPORT = "terminal_report"
"""The user property `terminal_report` texts go under (see `pytest_terminal_summary`)."""


@pytest.fixture(scope="session", autouse=True)
def _dummy_aws_credentials() -> Iterator[None]:
    """No test ever signs with, or even finds, real AWS credentials."""
    with pytest.MonkeyPatch.context() as patch:
        for name in AWS_ENV_TO_REMOVE:
            patch.delenv(name, raising=False)
        for name, value in dummy_aws_env().items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="session", autouse=True)
def _plain_tracebacks_in_logs() -> Iterator[None]:
    """structlog's default configuration (what a test gets unless it configures logging),
    with plain tracebacks: its default formatter is rich's, with every frame's locals,
    ~0.5 s of CPU a logged exception (2.6 of 15 s in ten simulated worlds, which log
    their injected faults)."""
    structlog.reset_defaults()
    plain = structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback)
    defaults = structlog.get_config()["processors"]
    structlog.configure(
        processors=[plain if isinstance(p, structlog.dev.ConsoleRenderer) else p for p in defaults]
    )
    yield
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """Every test leaves logging as it found it: a test that configures logging
    (`config.configure_logging`, a CLI's ``main`` called in process) would otherwise leave
    a handler on the stream pytest captured for it, and its level, to the tests after it;
    and a CLI's ``--log-level``/``--log-format`` set ``LM_LOGGING__*`` in this process's
    environment (`config.cli`: for the processes it starts), which every collector a
    later test starts would inherit (it once silenced one's info lines)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    saved = structlog.get_config()
    environment = {name: os.environ.get(name) for name in LOGGING_ENV}
    structlog.contextvars.clear_contextvars()
    yield
    structlog.contextvars.clear_contextvars()
    for handler in root.handlers:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    structlog.configure(**saved)
    for name, value in environment.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def ministack_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A MiniStack S3 server for the whole session (S3_PERSIST=1 under a temp dir)."""
    server = start_ministack(tmp_path_factory.mktemp("ministack"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A moto S3 server for the whole session (not safe for concurrent conditional writes)."""
    server = start_moto(tmp_path_factory.mktemp("moto"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def terminal_report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Add a text (a tally the run should show, such as the PromQL differential check's)
    to the terminal summary at the end of the run. Printing it from the test would not
    do: a pytest-xdist worker's own output never reaches the terminal, but a test's user
    properties travel with its report."""

    def add(text: str) -> None:
        request.node.user_properties.append((TERMINAL_REPORT, text))

    return add


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    """Every `terminal_report` text, passed tests' and failed ones', once each."""
    texts = [
        value
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"  # not again for setup and teardown
        for name, value in getattr(report, "user_properties", ())
        if name == TERMINAL_REPORT
    ]
    if texts:
        terminalreporter.section("reports")
        for text in texts:
            terminalreporter.write_line(text)


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The one Spark session of the test run (local[2]; ~5-10 s to start). Each job sets
    its own shuffle partitions at run time (the rollup's stages, the audit's
    `size_shuffle`), so sharing the session changes no result."""
    from rollup.job.spark_session import local_spark

    # py4j logs at INFO when its connections close, as late as interpreter exit, when a
    # CLI test's log handler may hold a closed capture stream: not restored afterwards.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    with local_spark(master="local[2]", app_name="lm-tests") as session:
        yield session


@pytest.fixture
def ministack_bucket(ministack_server: RunningServer) -> str:
    """A new, empty bucket on the session's MiniStack, unique to this test."""
    return fresh_bucket(ministack_server)


@pytest.fixture
def moto_bucket(moto_server: RunningServer) -> str:
    """A new, empty bucket on the session's moto server, unique to this test."""
    return fresh_bucket(moto_server)
