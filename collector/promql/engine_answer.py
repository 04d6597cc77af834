"""Reading and judging a PromQL engine's answer (PROTOCOL §5, "Failures are never empty
answers"): which of its warnings report a failed remote read, and how to add ``partial:``
warnings to an answer without re-encoding it.

A Prometheus engine turns a failed remote read into a warning and an empty result, so
``absent(x)`` answers 1. Prometheus 2.42 (``storage/remote/read.go``) wraps every error of
its remote-read client as ``remote_read: <error>``, and its client
(``storage/remote/client.go``, v2.42.0) says one of `REMOTE_READ_ERRORS` — checked
against the engine's answers in ``tests/collector/promql/test_forward_engine.py``::

    remote_read: remote server http://127.0.0.1:8080/api/v1/read returned HTTP status 429 Too Many Requests: ...
    remote_read: error sending request: Post "http://...": context deadline exceeded
    remote_read: error reading response: snappy: corrupt input

An engine answer is a JSON object whose top-level ``warnings`` array, when there is one,
Prometheus writes after ``data``. The answer can be large (a range query's matrix), so
it is never decoded whole: the array is found by the last ``,"warnings":[`` (inside
``data`` a string never ends in an unescaped quote followed by ``:[`` — label values are
strings and no key of ``data`` named "warnings" holds an array) and decoded alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

REMOTE_READ_PREFIX = "remote_read: "
"""Prometheus 2.42's prefix of every remote-read error it turns into a warning."""
REMOTE_READ_ERRORS = (
    "remote server ",  # "remote server %s returned HTTP status %s: %s"
    "error sending request: ",  # connection refused, reset, its remote_timeout
    "error reading response",  # ": %w" (snappy) and ". HTTP status code: %s: %w"
    "unable to unmarshal response body: ",
    "responses: want ",  # "responses: want %d, got %d"
    "unsupported content type",  # newer clients, for a response type they do not know
)
"""The remote-read client errors of Prometheus 2.42 (``storage/remote/client.go``)."""
PROMQL_ANNOTATIONS = ("PromQL warning:", "PromQL info:")
"""PromQL's own annotations (newer engines): they pass through unchanged."""

_WARNINGS_KEY = b',"warnings":['
_SUCCESS_START = b'{"status":"success"'


class AnswerNotJson(ValueError):
    """The engine's 200 answer is not the JSON object Prometheus writes."""


@dataclass(frozen=True, slots=True)
class WarningsSpan:
    """The top-level ``warnings`` of an answer and where its array lies in the bytes
    (``start``: the ``[``, ``end``: one past the ``]``); ``start == end`` when absent."""

    warnings: tuple[str, ...]
    start: int
    end: int


def is_remote_read_failure(warning: str) -> bool:
    """True for Prometheus' warning about a failed remote read (see the module doc)."""
    if warning.startswith(PROMQL_ANNOTATIONS):
        return False
    if warning.startswith(REMOTE_READ_PREFIX):
        return True
    return warning.startswith(REMOTE_READ_ERRORS)


def answer_warnings(body: bytes | bytearray) -> WarningsSpan:
    """The top-level ``warnings`` of a successful engine answer (`AnswerNotJson` if the
    bytes are not one)."""
    if not body.startswith(_SUCCESS_START):
        return _decode_whole(body)
    at = body.rfind(_WARNINGS_KEY)
    if at < 0:
        if not body.rstrip().endswith(b"}"):
            raise AnswerNotJson("the engine's answer is cut short")
        return WarningsSpan((), len(body), len(body))
    start = at + len(_WARNINGS_KEY) - 1
    try:
        tail = body[start:].decode("utf-8")
        warnings, length = json.JSONDecoder().raw_decode(tail)
    except (UnicodeDecodeError, ValueError) as exc:
        raise AnswerNotJson(f"the engine's warnings are not JSON: {exc}") from None
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        raise AnswerNotJson("the engine's warnings are not a list of strings")
    if tail[length:].strip() != "}":
        return _decode_whole(body)  # something after the warnings: read it all
    end = start + len(tail[:length].encode("utf-8"))
    return WarningsSpan(tuple(warnings), start, end)


def _decode_whole(body: bytes | bytearray) -> WarningsSpan:
    try:
        answer = json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise AnswerNotJson(f"the engine's answer is not JSON: {exc}") from None
    if not isinstance(answer, dict):
        raise AnswerNotJson("the engine's answer is not a JSON object")
    warnings = answer.get("warnings") or []
    if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
        raise AnswerNotJson("the engine's warnings are not a list of strings")
    return WarningsSpan(tuple(warnings), -1, -1)


def with_warnings(
    body: bytes | bytearray, span: WarningsSpan, extra: list[str]
) -> bytes | bytearray:
    """``body`` with ``extra`` appended to its top-level warnings; everything else is
    left byte for byte. A ``bytearray`` is changed in place: only the bytes after the
    warnings move (Prometheus writes them last), never the answer's ``data``."""
    if not extra:
        return body
    if span.start < 0:  # decoded whole: encode whole
        answer = json.loads(body)
        answer["warnings"] = [*answer.get("warnings", []), *extra]
        return json.dumps(answer, separators=(",", ":")).encode("utf-8")
    array = json.dumps([*span.warnings, *extra], separators=(",", ":")).encode("utf-8")
    if span.start == span.end:  # no warnings yet: before the closing brace
        closing = body.rstrip().rfind(b"}")
        start, end, array = closing, closing, b',"warnings":' + array
    else:
        start, end = span.start, span.end
    if isinstance(body, bytearray):
        body[start:end] = array
        return body
    return body[:start] + array + body[end:]
