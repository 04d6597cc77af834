"""configure_logging: JSON lines with context, console output, levels, stdlib routing."""

from __future__ import annotations

import io
import json
import logging
from datetime import datetime, timedelta
from typing import Any

import pytest
import structlog

from config import LoggingSettings, configure_logging


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_bound_context() -> None:
    stream = io.StringIO()
    configure_logging(LoggingSettings(format="json"), stream=stream)
    structlog.contextvars.bind_contextvars(request_id="r-1", agent_id="eu-1")
    structlog.get_logger("collector.http").info("batch_accepted", latency_ms=3)
    [line] = json_lines(stream)
    assert line["event"] == "batch_accepted"
    assert line["level"] == "info"
    assert line["logger"] == "collector.http"
    assert line["request_id"] == "r-1"
    assert line["agent_id"] == "eu-1"
    assert line["latency_ms"] == 3
    stamp = datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00"))
    assert stamp.utcoffset() == timedelta(0)
    assert list(line)[:4] == ["timestamp", "level", "logger", "event"]


def test_stdlib_records_use_the_same_format() -> None:
    stream = io.StringIO()
    configure_logging(LoggingSettings(format="json"), stream=stream)
    structlog.contextvars.bind_contextvars(request_id="r-2")
    logging.getLogger("aiohttp.access").info("GET %s %d", "/v1/batches", 200)
    [line] = json_lines(stream)
    assert line["event"] == "GET /v1/batches 200"
    assert line["logger"] == "aiohttp.access"
    assert line["request_id"] == "r-2"


def test_level_filters_both_kinds() -> None:
    stream = io.StringIO()
    configure_logging(LoggingSettings(format="json", level="warning"), stream=stream)
    log = structlog.get_logger("x")
    log.info("dropped")
    logging.getLogger("y").info("dropped too")
    log.warning("kept")
    logging.getLogger("y").error("kept too")
    assert [line["event"] for line in json_lines(stream)] == ["kept", "kept too"]


def test_exceptions_are_structured_without_locals() -> None:
    stream = io.StringIO()
    configure_logging(LoggingSettings(format="json"), stream=stream)
    secret = "bearer-token-value"
    try:
        raise RuntimeError("store down")
    except RuntimeError:
        structlog.get_logger("x").exception("failed", secret_len=len(secret))
    [line] = json_lines(stream)
    assert line["exception"][0]["exc_type"] == "RuntimeError"
    assert secret not in stream.getvalue()


def test_configuring_twice_replaces_the_handler() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging(LoggingSettings(format="json"), stream=first)
    log = structlog.get_logger("x")  # fetched before reconfiguration
    configure_logging(LoggingSettings(format="json", level="debug"), stream=second)
    log.debug("once")
    assert first.getvalue() == ""
    assert [line["event"] for line in json_lines(second)] == ["once"]


def test_auto_is_console_on_a_terminal_and_json_otherwise() -> None:
    terminal = FakeTerminal()
    configure_logging(LoggingSettings(format="auto"), stream=terminal)
    structlog.contextvars.bind_contextvars(request_id="r-3")
    structlog.get_logger("x").info("hello", n=1)
    text = terminal.getvalue()
    assert "hello" in text and "request_id" in text and "r-3" in text
    assert not text.lstrip().startswith("{")

    pipe = io.StringIO()
    configure_logging(LoggingSettings(format="auto"), stream=pipe)
    structlog.get_logger("x").info("hello")
    assert json_lines(pipe)[0]["event"] == "hello"


def test_console_format_renders_exceptions() -> None:
    stream = io.StringIO()
    configure_logging(LoggingSettings(format="console"), stream=stream)
    try:
        raise ValueError("bad frame")
    except ValueError:
        structlog.get_logger("x").exception("failed")
    assert "ValueError: bad frame" in stream.getvalue()


@pytest.mark.parametrize("stream_kind", [io.StringIO, FakeTerminal])
def test_console_tracebacks_show_no_locals(stream_kind: type[io.StringIO]) -> None:
    """A frame's locals may hold a bearer token or a frame body: the console format prints
    the traceback (file, line, code, the exception), never the values of locals, whether
    or not the stream is a terminal."""
    stream = stream_kind()
    configure_logging(LoggingSettings(format="console"), stream=stream)

    def authorize(header: str) -> None:
        token = header.removeprefix("Bearer ")
        raise PermissionError(f"token of {len(token)} characters refused")

    secret = "-".join(["s3cr3t", "bearer", "token"])  # a value, not in any source line
    try:
        authorize(f"Bearer {secret}")
    except PermissionError:
        structlog.get_logger("x").exception("failed")
    text = stream.getvalue()
    assert "PermissionError" in text and "authorize" in text
    assert secret not in text
