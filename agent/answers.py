"""What a collector's answer to one POST means to an agent (PROTOCOL §2): the parsed
body, its error code, ``Retry-After``, and whether the fault is that collector's alone."""

from __future__ import annotations

import datetime
import email.utils
import json
from dataclasses import dataclass
from typing import Any

from protocol.batch_api import CLOCK_SKEWED


@dataclass(frozen=True, slots=True)
class Answer:
    """One attempt's answer: HTTP status and JSON body, or the network error."""

    status: int | None
    response: Any
    error: str | None
    retry_after_s: float | None
    latency_s: float
    reached: bool = True

    @property
    def collector_local(self) -> bool:
        """The fault is that collector's alone, so another collector may be tried at once:
        it was not reached, or it refused because its own clock is off the store's
        (PROTOCOL §3.8, 503 ``clock_skewed``). Anything else (429, a 503 of the store, a
        timeout) may be shared by every collector, and is met with backoff."""
        if not self.reached:
            return True
        return self.status == 503 and reason_of(self.response, "") == CLOCK_SKEWED


def parse_json(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return {"unparsed_body": body[:512].decode("utf-8", "replace")}


def reason_of(response: Any, default: str) -> str:
    if isinstance(response, dict) and isinstance(response.get("error"), str):
        return str(response["error"])
    return default


def retry_after_s(header: str | None, now_ns: int) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date (RFC 9110)."""
    if header is None:
        return None
    header = header.strip()
    try:
        return max(0.0, float(header))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(header)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - now_ns / 1e9)
