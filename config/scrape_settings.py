"""``[scrape]``: the settings of ``lm-agent scrape`` (`agent.scrape`)."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Annotated

from pydantic import Field, model_validator

from config.errors import CrossFieldError
from config.section import AbsolutePath, MiB, Seconds, Section


def _default_agent_id() -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", socket.gethostname()).strip("-.")[:128] or "lm-agent"


AgentId = Annotated[str, Field(pattern=r"^[^\x00-\x1f\x7f]+$")]


class ScrapeTarget(Section):
    """One ``[[scrape.targets]]`` entry: a Prometheus text endpoint and the labels added
    to every sample scraped from it (as Prometheus target labels: they win over scraped
    labels of the same name, which are kept as ``exported_<name>``)."""

    url: str = Field(pattern=r"^https?://[^/?#\s]+")
    labels: dict[str, str] = Field(default_factory=dict)


class ScrapeSettings(Section):
    """``[scrape]``: ``lm-agent scrape`` (`agent.scrape`), a long-running agent that scrapes
    Prometheus text endpoints and delivers the samples as frames through its spool."""

    agent_id: AgentId = Field(default_factory=_default_agent_id, max_length=128)
    """The agent_id of every frame (default: the host name)."""
    collector_urls: list[Annotated[str, Field(pattern=r"^https?://[^/?#\s]+")]] = Field(
        default_factory=lambda: ["http://127.0.0.1:8080"], min_length=1
    )
    """Collectors to deliver to, round-robin (a retry goes to the next one; one that
    cannot be reached, or refuses for its own clock, is passed over at once)."""
    token_file: AbsolutePath | None = None
    """File holding the bearer token; ``None`` = no Authorization header."""
    spool_dir: AbsolutePath = Path("./lm-agent-spool")
    """Durable spool; frames wait here until a collector answers 200 (survives restarts)."""
    targets: list[ScrapeTarget] = Field(default_factory=list)
    interval_s: Seconds = 15.0
    """Time between scrape starts (a slow scrape delays the next one, never overlaps it)."""
    timeout_s: Seconds = 10.0
    """Longest one scrape of one target may take; must be <= interval_s."""
    max_target_bytes: int = Field(default=16 * MiB, ge=1)
    """A target answering more than this is a failed scrape (up = 0)."""
    flush_interval_s: Seconds = 60.0
    """Scraped points are framed and spooled at least this often (and on stop): fewer,
    larger frames cost fewer store requests; what is not yet spooled is lost on kill -9."""
    max_batch_points: int = Field(default=50_000, ge=1)
    """A frame is spooled as soon as this many points are waiting."""
    max_buffered_points: int = Field(default=500_000, ge=1)
    """Points held in memory while the spool is full; scrapes beyond it are dropped (logged)."""
    max_pending_frames: int = Field(default=10_000, ge=1)
    max_pending_bytes: int = Field(default=1024 * MiB, ge=1)
    upload_concurrency: int = Field(default=4, ge=1)
    request_timeout_s: Seconds = 30.0
    self_metrics: bool = True
    """Record the agent's own health with every scrape round (``lm_agent_*`` series,
    ``job="lm-agent"``, ``instance`` = agent_id: spool backlog, drops, deliveries by
    outcome; `agent.health`)."""
    shutdown_grace_s: Seconds = 10.0
    """On SIGTERM: finish the scrape under way, spool what was scraped, then try this long
    to deliver what is pending (the rest stays in the spool for the next start)."""

    @model_validator(mode="after")
    def _timeout_fits_interval(self) -> ScrapeSettings:
        if self.timeout_s > self.interval_s:
            raise CrossFieldError(
                "scrape.timeout_s",
                f"must be <= scrape.interval_s = {self.interval_s:g}, got {self.timeout_s:g}",
                related=("scrape.interval_s",),
            )
        return self
