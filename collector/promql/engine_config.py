"""The PromQL engine's configuration (PROTOCOL §5): what `lm-collector promql-config`
writes for a sidecar engine and what the supervised engine (`collector.promql.engine`)
gets at each start.

The engine is a stock Prometheus 2.x (>= 2.42) that holds no data of its own:

- ``prometheus.yml``: no scrape jobs, no rule files, no external labels (a remote read
  with external labels would add matchers and strip labels), one ``remote_read`` to this
  collector's ``POST /api/v1/read`` with ``read_recent: true`` (without it Prometheus
  skips remote read for the ranges its own, empty, TSDB claims to cover),
  ``remote_timeout`` (< ``--query.timeout``) and ``authorization.credentials_file``: the
  internal principal's bearer token, which Prometheus reads again on every request, so
  the collector can write a new one at each of its starts without restarting a sidecar.
- ``web.yml`` (``--web.config.file``): ``basic_auth_users`` with the bcrypt hash of a
  random password; the collector sends the password (``engine-password``) on every
  forwarded request. Prometheus re-reads this file on every request too.
- The flags (`engine_flags`): ``--query.lookback-delta``, ``--query.timeout``,
  ``--query.max-concurrency`` (= ``query.max_concurrent_promql``), a disposable
  ``--storage.tsdb.path`` with minimal retention, ``--web.listen-address`` on loopback.

Secrets live in a directory of mode 0700, each file mode 0600, written whole (a
temporary file renamed over the old one), so a reader never sees half a token.

The YAML is written by hand: every string is a JSON string, which YAML reads the same
(YAML 1.2 is a superset of JSON), so no value can break the structure.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

import bcrypt

from config.query_settings import PromqlSettings

ENGINE_USER = "lightmetrics"
"""The engine's one basic-auth user (``query.promql.basic_auth_password_file`` holds its
password)."""
CONFIG_FILE = "prometheus.yml"
WEB_CONFIG_FILE = "web.yml"
PASSWORD_FILE = "engine-password"
READ_TOKEN_FILE = "read-token"
ARGS_FILE = "prometheus.args"
REMOTE_READ_NAME = "lightmetrics"
# A random 256-bit password cannot be guessed whatever the hash's cost; a low cost keeps
# the engine's check of every forwarded request cheap (exporter-toolkit caches it too).
BCRYPT_ROUNDS = 6
TSDB_RETENTION = "1h"  # the TSDB stays empty: nothing scrapes or writes into it


@dataclass(frozen=True, slots=True)
class EngineFiles:
    """The files of one engine configuration, all inside `directory` (mode 0700)."""

    directory: Path

    @property
    def config_file(self) -> Path:
        return self.directory / CONFIG_FILE

    @property
    def web_config_file(self) -> Path:
        return self.directory / WEB_CONFIG_FILE

    @property
    def password_file(self) -> Path:
        return self.directory / PASSWORD_FILE

    @property
    def read_token_file(self) -> Path:
        return self.directory / READ_TOKEN_FILE

    @property
    def args_file(self) -> Path:
        return self.directory / ARGS_FILE


def new_secret() -> str:
    """A random URL-safe secret of 256 bits (a token or a password)."""
    return secrets.token_urlsafe(32)


def prom_duration(seconds: float) -> str:
    """A Prometheus duration (``90s``, ``1500ms``) for a positive number of seconds."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"a Prometheus duration must be at least 1 ms, got {seconds!r} s")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def private_directory(path: Path) -> Path:
    """Create ``path`` (mode 0700) or make an existing one 0700; refuse a symlink or a
    directory owned by someone else (its files would be readable or replaceable)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"{path} must be a directory, not a symlink")
    if info.st_uid != os.geteuid():
        raise ValueError(f"{path} belongs to uid {info.st_uid}, not to this process")
    os.chmod(path, 0o700)
    return path


def write_private_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600, whole: a temporary file in the same
    directory, fsync'd, then renamed over ``path``."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def prometheus_yml(*, read_url: str, remote_timeout_s: float, read_token_file: Path) -> str:
    """The engine's ``prometheus.yml``: one remote read of this collector, nothing else."""
    q = json.dumps
    return (
        "# Written by lm-collector promql-config (PROTOCOL §5): the PromQL engine holds no\n"
        "# data; it reads everything through the collector's remote read. No scrape jobs,\n"
        "# no rules, no external labels.\n"
        "global: {}\n"
        "remote_read:\n"
        f"  - url: {q(read_url)}\n"
        f"    name: {q(REMOTE_READ_NAME)}\n"
        f"    remote_timeout: {q(prom_duration(remote_timeout_s))}\n"
        "    read_recent: true\n"
        "    follow_redirects: false\n"
        "    authorization:\n"
        '      type: "Bearer"\n'
        f"      credentials_file: {q(str(read_token_file))}\n"
    )


def web_yml(password: str) -> str:
    """The engine's ``--web.config.file``: basic auth for `ENGINE_USER` only."""
    hashed = bcrypt.hashpw(password.encode("utf-8"), bcrypt.gensalt(rounds=BCRYPT_ROUNDS))
    return (
        "# Written by the lightmetrics collector: the engine's HTTP API needs basic auth.\n"
        "basic_auth_users:\n"
        f"  {json.dumps(ENGINE_USER)}: {json.dumps(hashed.decode('ascii'))}\n"
    )


def engine_flags(
    files: EngineFiles,
    settings: PromqlSettings,
    *,
    max_concurrency: int,
    listen: str,
    tsdb_path: Path,
) -> list[str]:
    """The engine's command-line flags (after its binary)."""
    return [
        f"--config.file={files.config_file}",
        f"--web.config.file={files.web_config_file}",
        f"--web.listen-address={listen}",
        f"--storage.tsdb.path={tsdb_path}",
        f"--storage.tsdb.retention.time={TSDB_RETENTION}",
        f"--query.lookback-delta={prom_duration(settings.lookback_delta_s)}",
        f"--query.timeout={prom_duration(settings.query_timeout_s)}",
        f"--query.max-concurrency={max_concurrency}",
    ]


def write_engine_config(
    directory: Path, *, read_url: str, settings: PromqlSettings, password: str | None = None
) -> tuple[EngineFiles, str]:
    """Write ``prometheus.yml``, ``web.yml`` and ``engine-password`` into ``directory``
    (made private). Returns the files and the password (new unless given). The read
    token file is named but not written: the collector writes it at each start."""
    files = EngineFiles(private_directory(directory))
    password = password if password is not None else new_secret()
    write_private_file(files.password_file, password + "\n")
    write_private_file(files.web_config_file, web_yml(password))
    write_private_file(
        files.config_file,
        prometheus_yml(
            read_url=read_url,
            remote_timeout_s=settings.remote_timeout_s,
            read_token_file=files.read_token_file,
        ),
    )
    return files, password


def read_password(path: Path) -> str:
    """The basic-auth password in ``path`` (one line, as `write_engine_config` writes it)."""
    password = path.read_text(encoding="utf-8").strip()
    if not password:
        raise ValueError(f"{path} holds no password")
    return password
