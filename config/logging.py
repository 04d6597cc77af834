"""Logging set-up for every process, called once by each ``__main__``/CLI entry point.

structlog loggers and stdlib loggers (aiohttp's access log, botocore, py4j) end in one
handler on the root logger, so both come out in one format:

- ``json``: one JSON object per line with ``timestamp`` (ISO 8601, UTC), ``level``,
  ``event``, ``logger`` (stdlib records), every key bound with
  `structlog.contextvars.bind_contextvars` (request id, agent, identity, ...) and the
  call's own keys; exceptions as structured tracebacks.
- ``console``: structlog's readable `ConsoleRenderer`, coloured on a terminal.
- ``auto`` (default): console when the stream is a terminal, else JSON.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog
from structlog.typing import Processor

from config.settings import LoggingSettings


class _LightmetricsHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Marks the root handler this module installs, so a second call replaces it."""


def configure_logging(settings: LoggingSettings, *, stream: TextIO | None = None) -> None:
    """Route structlog and stdlib logging to ``stream`` (default: standard error) at
    ``settings.level`` in ``settings.format``. Calling it again replaces the previous
    configuration instead of adding a second handler."""
    out: TextIO = sys.stderr if stream is None else stream
    level = logging.getLevelNamesMapping()[settings.level.upper()]
    as_json = settings.format == "json" or (settings.format == "auto" and not _is_tty(out))

    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
    ]
    renderer: list[Processor]
    if as_json:
        renderer = [
            # Without locals: a frame's locals may hold a bearer token or a frame body.
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            ),
            _leading_keys_first,
            structlog.processors.JSONRenderer(),
        ]
    else:
        # ConsoleRenderer formats exc_info itself (and warns if it was done before it). Its
        # default formatter prints every frame's locals (a bearer token, a frame body) and
        # takes about half a second an exception: rich without locals on a terminal, the
        # plain traceback otherwise.
        terminal = _is_tty(out)
        tracebacks: structlog.typing.ExceptionRenderer = (
            structlog.dev.RichTracebackFormatter(show_locals=False)
            if terminal
            else structlog.dev.plain_traceback
        )
        renderer = [structlog.dev.ConsoleRenderer(colors=terminal, exception_formatter=tracebacks)]

    formatter = structlog.stdlib.ProcessorFormatter(
        # Applied to records from stdlib loggers only; structlog events ran `shared`.
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
    )
    handler = _LightmetricsHandler(out)
    handler.setFormatter(formatter)

    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _LightmetricsHandler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level)

    structlog.configure(
        processors=[
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # Not cached, so a later configure_logging (tests, CLI flags) reaches loggers
        # that module code fetched earlier.
        cache_logger_on_first_use=False,
    )


_LEADING_KEYS = ("timestamp", "level", "logger", "event")


def _leading_keys_first(
    _logger: object, _method: str, event_dict: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Put timestamp, level, logger and event first in each JSON line, for people
    reading raw logs; the rest keep their order."""
    ordered = {k: event_dict.pop(k) for k in _LEADING_KEYS if k in event_dict}
    ordered.update(event_dict)
    return ordered


def _is_tty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # closed stream
        return False
