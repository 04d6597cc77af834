"""``lm-collector promql-config``: write a sidecar PromQL engine's configuration
(PROTOCOL §5) into a private directory:

- ``prometheus.yml``, ``web.yml``, ``engine-password`` (`collector.promql.engine_config`);
- ``prometheus.env``: ``PROMETHEUS_ARGS=...``, the engine's flags for a systemd unit
  (``ExecStart=/usr/bin/prometheus $PROMETHEUS_ARGS``, ``deploy/systemd``), and
  ``GOMEMLIMIT=<bytes>`` (`engine_setup.engine_memory_limit`, unless it is 0).

The collector, run with ``query.promql.url`` and the same ``credentials_dir``, writes its
read token there at each start and reads the password. Running the command again makes
a new password; Prometheus reads ``web.yml`` again on every request, so a running
engine takes it at once, and so does a collector at its next start.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from config import Settings

from .engine_config import EngineFiles, engine_flags, write_engine_config, write_private_file
from .engine_setup import engine_memory_limit
from .engine_sidecar import default_read_url

DEFAULT_LISTEN = "127.0.0.1:9091"
DEFAULT_TSDB = Path("/var/lib/lightmetrics/promql-tsdb")
ENV_FILE = "prometheus.env"


def add_promql_config_command(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    command = commands.add_parser(
        "promql-config", help="write a sidecar PromQL engine's configuration (PROTOCOL §5)"
    )
    command.add_argument(
        "--dir",
        type=Path,
        help="where to write it (default: query.promql.credentials_dir); made mode 0700",
    )
    command.add_argument(
        "--read-url",
        help="this collector's remote read as the engine reaches it "
        "(default: http.host and http.port + /api/v1/read)",
    )
    command.add_argument(
        "--listen", default=DEFAULT_LISTEN, help=f"the engine's address (default {DEFAULT_LISTEN})"
    )
    command.add_argument(
        "--tsdb-path",
        type=Path,
        default=DEFAULT_TSDB,
        help=f"the engine's (empty, disposable) TSDB directory (default {DEFAULT_TSDB})",
    )


def run_promql_config(args: argparse.Namespace, settings: Settings) -> int:
    promql = settings.query.promql
    directory = args.dir or promql.credentials_dir
    if directory is None:
        raise ValueError("give --dir or query.promql.credentials_dir")
    read_url = args.read_url or default_read_url(settings.http.host, settings.http.port)
    files, _ = write_engine_config(directory, read_url=read_url, settings=promql)
    flags = engine_flags(
        files,
        promql,
        max_concurrency=settings.query.max_concurrent_promql,
        listen=args.listen,
        tsdb_path=args.tsdb_path,
    )
    if any(any(c.isspace() or c in "\"'$\\" for c in flag) for flag in flags):
        raise ValueError("paths with spaces, quotes, '$' or '\\' cannot go into prometheus.env")
    env = f"PROMETHEUS_ARGS={' '.join(flags)}\n"
    memory_limit = engine_memory_limit(settings.query)
    if memory_limit is not None:
        # Go's GC otherwise lets the heap grow to about twice what is live (PROTOCOL §5's
        # answers in flight, decoded): the sidecar gets the supervised engine's limit.
        env += f"GOMEMLIMIT={memory_limit}\n"
    write_private_file(files.directory / ENV_FILE, env)
    _print_summary(files, flags, read_url)
    return 0


def _print_summary(files: EngineFiles, flags: list[str], read_url: str) -> None:
    print(f"wrote {files.config_file}, {files.web_config_file}, {files.password_file}")
    print(f"the engine reads {read_url} with the token the collector writes to")
    print(
        f"  {files.read_token_file} at each start (query.promql.credentials_dir = {files.directory})"
    )
    print("run the engine as:")
    print("  prometheus " + " ".join(flags))
