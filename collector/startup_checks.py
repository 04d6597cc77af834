"""What must hold before a collector binds anything (`collector.server.serve`): tokens or
a loopback address, a readable tokens file, and the settings that allow one collector
process only (``--workers 1``)."""

from __future__ import annotations

from config import Settings, load_tokens

from .promql.engine_setup import engine_problem, one_process_reason


class StartupError(Exception):
    """The collector must not start; the message says why and what to change."""


def check_startup(settings: Settings, workers: int) -> None:
    """Refuse configurations that would be unsafe, before binding anything."""
    if workers < 1:
        raise StartupError(f"--workers must be >= 1, got {workers}")
    if settings.auth.tokens_file is None and not settings.http.binds_loopback_only:
        raise StartupError(
            f"http.host {settings.http.host!r} is not a loopback address and no auth.tokens_file "
            "is configured: refusing to accept unauthenticated batches from the network. "
            "Configure auth.tokens_file, or bind 127.0.0.1."
        )
    if settings.auth.tokens_file is not None:
        load_tokens(settings.auth.tokens_file)  # a bad tokens file stops start-up here, exit 2
    if settings.query.designated and workers > 1:
        raise StartupError(
            f"query.designated = true allows one collector process, got --workers {workers}: "
            "the live query window is per process (run the designated query collector "
            "with --workers 1, or on its own host)"
        )
    if settings.ingest.acceptance == "local_spool" and workers > 1:
        raise StartupError(
            f"ingest.acceptance = 'local_spool' allows one collector process, got --workers {workers}: "
            "each process would decide acceptance from its own spool (PROTOCOL §3.4)"
        )
    if workers > 1 and (reason := one_process_reason(settings)) is not None:
        raise StartupError(f"{reason}, got --workers {workers}")
    if (problem := engine_problem(settings)) is not None:
        raise StartupError(problem)
