"""S3 failures as `store.errors` exceptions, by what the caller should do (see
`store.s3`'s docstring): a 412 is `PreconditionFailed`, a 409 `ConditionConflict`, a 404
`NotFound`, throttling and 5xx `Unavailable` (or `OutcomeUnknown` for a write that may
have applied), a request that was never sent `Unavailable`, a lost answer to a write
`OutcomeUnknown`, and what repeating cannot fix (credentials, policy, a missing bucket)
`StoreConfigError`."""

from __future__ import annotations

import re
import socket

import aiohttp
from botocore import exceptions as botoexc

from store.errors import (
    ConditionConflict,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    StoreConfigError,
    Unavailable,
)

_THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "ServiceUnavailable",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "RequestTimeout",  # the server gave up reading our body: nothing was applied
    }
)
# Failures of the connection itself (after `_request_not_sent` has picked out connects).
_TRANSPORT_ERRORS = (
    botoexc.HTTPClientError,
    botoexc.ConnectionError,
    botoexc.IncompleteReadError,
    aiohttp.ClientError,
    TimeoutError,
)
_CONFLICT_CODES = frozenset({"ConditionalRequestConflict", "OperationAborted"})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})


def map_s3_error(op: str, key: str, exc: BaseException, *, mutating: bool) -> Exception:
    """The `store.errors` exception for a botocore/aiohttp failure (see module docstring).

    Returns ``exc`` itself for failures that are bugs in the call (bad parameters).
    """
    if isinstance(exc, botoexc.ClientError):
        return _map_client_error(op, key, exc, mutating=mutating)
    if isinstance(
        exc,
        botoexc.NoCredentialsError
        | botoexc.PartialCredentialsError
        | botoexc.ProfileNotFound
        | botoexc.NoRegionError,
    ):
        return StoreConfigError(f"{op} {key!r}: {exc}")
    if isinstance(exc, botoexc.CredentialRetrievalError):
        return Unavailable(op, key, f"credentials: {exc}")
    if isinstance(exc, botoexc.FlexibleChecksumError):
        # A GET's body did not match the checksum S3 sent with it: damaged on its way.
        # (Only answers are checked, so nothing was written: reading again is safe.)
        return Unavailable(op, key, f"checksum: {exc}")
    if _request_not_sent(exc):
        return Unavailable(op, key, f"not sent: {exc}")
    if isinstance(exc, _TRANSPORT_ERRORS):
        # Possibly sent, answer lost: read timeout, reset, closed, truncated body.
        kind = OutcomeUnknown if mutating else Unavailable
        return kind(op, key, f"answer lost: {exc}")
    return exc if isinstance(exc, Exception) else RuntimeError(str(exc))


def _request_not_sent(exc: BaseException) -> bool:
    """True when the failure happened before any byte of the request could arrive."""
    if isinstance(
        exc, botoexc.ConnectTimeoutError | botoexc.SSLError | botoexc.ProxyConnectionError
    ):
        return True
    if isinstance(exc, botoexc.EndpointConnectionError):
        # aiobotocore also wraps resets of an established connection (ClientOSError)
        # in EndpointConnectionError; only a failed connect proves nothing was sent.
        cause = exc.kwargs.get("error")
        return cause is None or isinstance(cause, aiohttp.ClientConnectorError | socket.gaierror)
    return isinstance(exc, aiohttp.ClientConnectorError)


def _map_client_error(op: str, key: str, exc: botoexc.ClientError, *, mutating: bool) -> Exception:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    message = str(error.get("Message", ""))
    return map_error_answer(op, key, status, code, message, mutating=mutating)


def map_error_answer(
    op: str, key: str, status: int, code: str, message: str, *, mutating: bool
) -> Exception:
    """The `store.errors` exception for an S3 error answer (status, error code, message)."""
    detail = f"{code or 'error'} (HTTP {status}): {message}".rstrip(": ")
    if status == 412 or code == "PreconditionFailed":
        return PreconditionFailed(op, key, detail)
    if status == 409 or code in _CONFLICT_CODES:
        return ConditionConflict(op, key, detail)
    if code == "NoSuchBucket":
        return StoreConfigError(f"{op} {key!r}: bucket does not exist: {detail}")
    if status == 404 or code in _NOT_FOUND_CODES:
        return NotFound(op, key, detail)
    if status in (429, 503) or code in _THROTTLING_CODES:
        return Unavailable(op, key, detail)
    if status >= 500:
        # 500 InternalError (and a gateway's 502/504) may come after the write applied.
        return (OutcomeUnknown if mutating else Unavailable)(op, key, detail)
    # 400/403/405/501...: credentials, policy, clock skew or an unsupported feature.
    # Repeating cannot help; the configuration (or the server) has to change.
    return StoreConfigError(f"{op} {key!r}: {detail}")


ERROR_BODY_MAX = 64 * 1024
_ERROR_FIELD = re.compile(rb"<(Code|Message)>([^<]{0,1024})</\1>")


def error_code_and_message(body: bytes) -> tuple[str, str]:
    """``Code`` and ``Message`` of an S3 XML error body (empty when absent or garbled)."""
    found = {m.group(1): m.group(2) for m in _ERROR_FIELD.finditer(body)}
    return (
        found.get(b"Code", b"").decode("utf-8", "replace"),
        found.get(b"Message", b"").decode("utf-8", "replace"),
    )
