"""How far the steady pass is behind the index log (PROTOCOL §3.7): one definition.

The lag is how long the oldest log segment not yet consumed has waited: store time minus
that segment's cut time (its name's), 0 when none waits (`lag_seconds`).
``lm-reconciler status`` lists the log from the checkpoint to find that segment
(`reconciler.status`); the daemon's gauge ``lm_reconciler_log_lag_seconds`` cannot list
at every scrape, so it uses what the steady pass already knows (`LogLag`), with no
request of its own:

- every segment the pass has listed and not yet consumed (its cut time), kept from
  the listing until the chunk holding it is committed (the checkpoint moved past it):
  a pass stuck reading or cataloging shows its oldest waiting segment growing older;
- segments not listed yet are newer than the last listing that reached the end of the
  log (listing order is time order), so they have waited at most since that listing
  started: its start is the bound used for them (none before the first such listing).
  Between passes the gauge therefore grows up to about ``loop_interval_s`` plus a pass
  even with nothing waiting: an upper bound where the pass cannot know more.

The gauge reads `LogLag.seconds` at each scrape (store time, `ReconcilerContext.clock`),
so it is fresh however long a pass runs; what it reads changes at each listing step and
chunk commit.
"""

from __future__ import annotations

from protocol.clock import Clock

NS_PER_S = 1_000_000_000


def lag_seconds(now_ns: int, oldest_waiting_ns: int | None) -> float:
    """How long the oldest waiting segment has waited at ``now_ns`` (0: none waits)."""
    if oldest_waiting_ns is None:
        return 0.0
    return max(0.0, (now_ns - oldest_waiting_ns) / NS_PER_S)


class LogLag:
    """The steady pass's knowledge of the waiting segments (see the module doc). Updated
    on the event loop; `seconds` only reads one int, so a scrape thread may call it."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._waiting: dict[str, int] = {}  # listed, not consumed: key -> first time
        self._listed_through: int | None = None  # start of the last complete listing
        self._listing_from: int | None = None  # start of the listing in progress
        self._oldest: int | None = None

    def listing_started(self, now_ns: int) -> None:
        """A pass starts listing from its checkpoint: what the last pass listed and left
        waiting is listed again (its names are found again, or were consumed elsewhere),
        so it becomes part of the bound until this listing completes."""
        self._listing_from = now_ns
        if self._waiting:
            oldest = min(self._waiting.values())
            through = self._listed_through
            self._listed_through = oldest if through is None else min(through, oldest)
            self._waiting.clear()
        self._refresh()

    def listed(self, key: str, time_ns: int) -> None:
        self._waiting[key] = time_ns
        if self._oldest is None or time_ns < self._oldest:
            self._oldest = time_ns

    def listing_complete(self) -> None:
        """The listing reached the end of the log: every segment not listed by now was
        written after it started."""
        self._listed_through = self._listing_from
        self._refresh()

    def consumed(self, segment_keys: list[str]) -> None:
        """The checkpoint moved past these segments."""
        for key in segment_keys:
            self._waiting.pop(key, None)
        self._refresh()

    def oldest_waiting_ns(self) -> int | None:
        return self._oldest

    def seconds(self) -> float:
        return lag_seconds(self._clock.now_ns(), self._oldest)

    def _refresh(self) -> None:
        bound = [self._listed_through] if self._listed_through is not None else []
        self._oldest = min([*self._waiting.values(), *bound], default=None)
