"""Prometheus' HTTP API JSON shapes (PROTOCOL §5): ``{"status": "success", "data": ...,
"warnings": [...]}`` and ``{"status": "error", "errorType": ..., "error": ...}``.

Error types and statuses as Prometheus' API uses them: 400 ``bad_data``, 422
``execution``, 503 ``unavailable``, 429 ``unavailable`` (Prometheus has no type of its
own for it; clients read the status), and for this collector's tokens 401
``unauthorized`` / 403 ``forbidden`` (Prometheus itself has none: its auth sits in
front of the API). Every read endpoint of `collector.promql` answers with these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from config.tokens import Principal

from ..auth import Authenticator
from ..intake import authorize

ERROR_TYPES = {
    400: "bad_data",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    422: "execution",
    429: "unavailable",
    503: "unavailable",
}


def success(data: Any, warnings: Sequence[str] = ()) -> web.Response:
    body: dict[str, Any] = {"status": "success", "data": data}
    if warnings:
        body["warnings"] = list(warnings)
    return web.json_response(body)


def error(
    status: int,
    message: str,
    *,
    error_type: str | None = None,
    headers: dict[str, str] | None = None,
    warnings: Sequence[str] = (),
) -> web.Response:
    body: dict[str, Any] = {
        "status": "error",
        "errorType": error_type or ERROR_TYPES.get(status, "internal"),
        "error": message,
    }
    if warnings:
        body["warnings"] = list(warnings)
    return web.json_response(body, status=status, headers=headers)


def authorize_read(authenticator: Authenticator, request: web.Request) -> Principal | web.Response:
    """`collector.intake.authorize` for ``read``, its refusal in Prometheus' shape
    (401 keeps ``WWW-Authenticate: Bearer``). Nothing else is done for the caller first."""
    outcome = authorize(authenticator, request, "read")
    if not isinstance(outcome, web.Response):
        return outcome
    if outcome.status == 401:
        return error(
            401,
            "a read token is required (Authorization: Bearer)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return error(outcome.status, "this token may not read (read = true in the tokens file)")
