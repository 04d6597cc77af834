"""An engine the operator runs beside the collector (``query.promql.url``, PROTOCOL §5):
a sidecar container in the query collector's pod, or a systemd unit with ``BindsTo=``
the collector's (``deploy/``), configured by ``lm-collector promql-config``.

At start the collector writes its per-start read token into the sidecar's
``credentials_file`` (``query.promql.credentials_dir``/``read-token``; Prometheus reads
that file again on every remote read, so the sidecar needs no restart) and reads the
basic-auth password ``promql-config`` wrote (``basic_auth_password_file``, default
``credentials_dir/engine-password``). It forwards nothing before the engine passed
`check_operator_engine` (Prometheus 2.x >= 2.42, ``read_recent: true``, no data of its
own); until then, checks repeat with the supervised engine's jittered backoff (1 s to
60 s: a sidecar may start after the collector; a check changes nothing, so repeating it
is safe). Once it passed, the engine is used until it fails to answer: the forward then
says 503 and the collector checks it again (a restarted sidecar may be another version).
"""

from __future__ import annotations

import asyncio
import contextlib
import random

import aiohttp
import structlog

from config.query_settings import PromqlSettings

from ..auth import EngineReadToken
from .engine import backoff_delay
from .engine_check import (
    EngineCheckFailed,
    EngineEndpoint,
    basic_authorization,
    check_operator_engine,
    is_ready,
)
from .engine_config import (
    ENGINE_USER,
    EngineFiles,
    private_directory,
    read_password,
    write_private_file,
)

log = structlog.get_logger("collector.promql.engine")
WATCH_INTERVAL_S = 10.0


class SidecarEngine:
    """``query.promql.url``: an engine the collector checks but does not run."""

    def __init__(
        self,
        *,
        settings: PromqlSettings,
        read_token: EngineReadToken,
        rng: random.Random | None = None,
    ) -> None:
        if settings.url is None or settings.credentials_dir is None:
            raise ValueError(
                "query.promql.url needs query.promql.credentials_dir: the directory shared with "
                "the engine where the collector writes its read token (lm-collector promql-config)"
            )
        self.base_url = settings.url.rstrip("/")
        self._files = EngineFiles(settings.credentials_dir)
        self._password_file = settings.basic_auth_password_file or self._files.password_file
        self._read_token = read_token
        self._rng = rng or random.Random()
        self._endpoint: EngineEndpoint | None = None
        self._down_reason = f"the PromQL engine at {self.base_url} has not been checked yet"
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    def current(self) -> EngineEndpoint | None:
        return self._endpoint

    @property
    def down_reason(self) -> str:
        return self._down_reason

    async def start(self, read_url: str) -> None:
        """Write the read token; check the engine in the background. ``read_url`` is where
        ``promql-config`` pointed the engine (not checked here: the engine's reads are)."""
        private_directory(self._files.directory)
        write_private_file(self._files.read_token_file, self._read_token.token + "\n")
        self._session = aiohttp.ClientSession()
        self._task = asyncio.create_task(self._watch(), name="promql-sidecar")

    async def _watch(self) -> None:
        assert self._session is not None
        failures = 0
        while not self._stopping.is_set():
            endpoint = self._endpoint
            if endpoint is not None and await is_ready(
                self._session, endpoint.base_url, endpoint.authorization
            ):
                failures, delay = 0, WATCH_INTERVAL_S
            else:
                self._endpoint = None
                try:
                    password = read_password(self._password_file)
                    authorization = basic_authorization(ENGINE_USER, password)
                    self._endpoint = await check_operator_engine(
                        self._session, self.base_url, authorization
                    )
                    failures, delay = 0, WATCH_INTERVAL_S
                    log.info(
                        "promql_engine_checked", url=self.base_url, version=self._endpoint.version
                    )
                except (EngineCheckFailed, OSError, ValueError) as exc:
                    self._down_reason = str(exc)
                    delay = backoff_delay(failures, self._rng)
                    failures += 1
                    log.warning("promql_engine_not_usable", reason=str(exc), retry_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    async def stop(self) -> None:
        self._stopping.set()
        if self._task is not None:
            await self._task
        if self._session is not None:
            await self._session.close()
        self._files.read_token_file.unlink(missing_ok=True)
        self._endpoint = None
        self._down_reason = "the collector is stopping"


def default_read_url(host: str, port: int) -> str:
    """This collector's ``/api/v1/read`` as its own engine reaches it: loopback when it
    listens on every address."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/api/v1/read"
