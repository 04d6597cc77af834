"""What the collector asks a PromQL engine over HTTP before it forwards anything to it
(PROTOCOL §5): is it ready (``/-/ready``), which Prometheus is it (``buildinfo``: at
least 2.42), and, for an engine the operator runs, is it configured as the contract
needs (``read_recent: true``, no data of its own).

Every call carries the engine's basic auth and its own timeout; a refusal or an error is
an `EngineCheckFailed` whose message says what to change.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp

MIN_VERSION = (2, 42)
"""The oldest Prometheus the contract accepts as engine (remote read with hints,
``read_recent``, the warnings this collector maps, ``--web.config.file``)."""
CHECK_TIMEOUT_S = 5.0
_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


class EngineCheckFailed(Exception):
    """The engine is not ready, or not one the contract allows; the message says why."""


class EngineRefused(EngineCheckFailed):
    """The engine answers but is not a Prometheus the contract allows (its version):
    starting or asking it again changes nothing."""


@dataclass(frozen=True, slots=True)
class EngineEndpoint:
    """A ready engine: where it listens, the header that authenticates the collector to
    it, and what its ``/api/v1/status/buildinfo`` said."""

    base_url: str
    authorization: str = field(repr=False)
    buildinfo: dict[str, Any]

    @property
    def version(self) -> str:
        return str(self.buildinfo.get("version", ""))


def basic_authorization(user: str, password: str) -> str:
    """An ``Authorization: Basic`` header value."""
    pair = f"{user}:{password}".encode()
    return "Basic " + base64.b64encode(pair).decode("ascii")


def parse_version(version: str) -> tuple[int, int, int] | None:
    """``2.42.0+ds`` → ``(2, 42, 0)``; None when it does not start with a version."""
    match = _VERSION_RE.match(version.strip())
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def check_version(buildinfo: dict[str, Any]) -> None:
    """Refuse an engine older than `MIN_VERSION` or not Prometheus 2.x."""
    version = str(buildinfo.get("version", ""))
    parsed = parse_version(version)
    if parsed is None or parsed[0] != MIN_VERSION[0] or parsed[:2] < MIN_VERSION:
        raise EngineRefused(
            f"the PromQL engine is Prometheus {version or '(no version)'}; PROTOCOL §5 needs "
            f"Prometheus 2.x >= {MIN_VERSION[0]}.{MIN_VERSION[1]}"
        )


async def _get_json(
    session: aiohttp.ClientSession, base_url: str, path: str, authorization: str
) -> dict[str, Any]:
    try:
        async with session.get(
            base_url + path,
            headers={"Authorization": authorization},
            timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S),
            allow_redirects=False,
        ) as response:
            if response.status in (401, 403):
                raise EngineCheckFailed(
                    f"the PromQL engine refuses the collector's basic auth on {path} "
                    f"({response.status}): is its --web.config.file the one written with "
                    "query.promql.basic_auth_password_file?"
                )
            if response.status != 200:
                raise EngineCheckFailed(f"the PromQL engine answers {path} with {response.status}")
            body = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise EngineCheckFailed(f"the PromQL engine at {base_url} is not reachable: {exc}") from exc
    if not isinstance(body, dict):
        raise EngineCheckFailed(f"the PromQL engine's {path} is not a JSON object")
    return body


async def is_ready(session: aiohttp.ClientSession, base_url: str, authorization: str) -> bool:
    """True when ``/-/ready`` answers 200 with our basic auth."""
    try:
        async with session.get(
            base_url + "/-/ready",
            headers={"Authorization": authorization},
            timeout=aiohttp.ClientTimeout(total=CHECK_TIMEOUT_S),
            allow_redirects=False,
        ) as response:
            await response.read()
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def fetch_buildinfo(
    session: aiohttp.ClientSession, base_url: str, authorization: str
) -> dict[str, Any]:
    """The engine's ``/api/v1/status/buildinfo`` ``data``, checked by `check_version`."""
    body = await _get_json(session, base_url, "/api/v1/status/buildinfo", authorization)
    data = body.get("data")
    if body.get("status") != "success" or not isinstance(data, dict):
        raise EngineCheckFailed("the PromQL engine's buildinfo answer has no data")
    check_version(data)
    return data


async def check_operator_engine(
    session: aiohttp.ClientSession, base_url: str, authorization: str
) -> EngineEndpoint:
    """An operator-run engine (``query.promql.url``): Prometheus 2.x >= 2.42, a remote
    read with ``read_recent: true``, and no series of its own (its TSDB head is empty:
    a scrape job or a remote-write receiver would mix its data into every answer)."""
    buildinfo = await fetch_buildinfo(session, base_url, authorization)
    config = await _get_json(session, base_url, "/api/v1/status/config", authorization)
    yaml_text = str((config.get("data") or {}).get("yaml", ""))
    # Prometheus writes its loaded configuration back in canonical YAML.
    if "remote_read:" not in yaml_text or "read_recent: true" not in yaml_text:
        raise EngineCheckFailed(
            "the PromQL engine's configuration has no remote_read with read_recent: true "
            "(write it with lm-collector promql-config)"
        )
    if "scrape_configs:" in yaml_text:
        raise EngineCheckFailed(
            "the PromQL engine has scrape jobs: it must hold no data of its own (PROTOCOL §5)"
        )
    tsdb = await _get_json(session, base_url, "/api/v1/status/tsdb", authorization)
    head = (tsdb.get("data") or {}).get("headStats") or {}
    if int(head.get("numSeries", 0) or 0) != 0:
        raise EngineCheckFailed(
            f"the PromQL engine's TSDB holds {head.get('numSeries')} series of its own: it must "
            "hold no data (PROTOCOL §5)"
        )
    return EngineEndpoint(base_url, authorization, buildinfo)
