"""Store time (PROTOCOL §3.8): the object store's clock, as this process can know it.

Object ages (GC horizon, mark grace, settle times, vacuum's minimum age) compare an
object's LastModified, which the *store* stamps, with "now". Taking "now" from the local
clock alone lets a host whose clock runs ahead delete files of a commit still in flight.
So every such "now" is *store time*: the local clock plus the offset of the store's clock
measured from the ``Date`` header of its answers.

- `ClockOffset` is what one process knows of that offset. `store.s3.S3Store` feeds it
  the ``Date`` header of every answered request (errors included), with the local times
  the request was sent and answered, so measuring costs no request. ``Date`` has one
  second resolution: the store stamped a time in ``[D, D + 1s)`` somewhere between
  sending and answering, which bounds the offset to ``[D - answered, D + 1s - sent]``.
  Successive answers narrow it: the bounds kept are the overlap of every answer's, each
  widened by the most two clocks can drift apart since (`MAX_DRIFT`), so they stay true
  bounds. An answer that does not overlap them means a clock was stepped: the bounds
  start over from it.
- `StoreClock` is a `Clock` whose ``now_ns`` is store time: the local clock plus the
  *lower* bound of the offset. Store time is therefore never ahead of the store (it lags
  by up to 1 s plus a round trip): ages come out too young, never too old, so nothing is
  deleted early and another holder's lease is never judged expired early. Its
  ``latest_ns`` uses the *upper* bound instead: the latest the store's clock may read
  now, which is what a lease holder asks before acting (`store.lease.Lease.is_valid`), so
  a slow answer never makes its own lease look longer than it is.
- `store_clock(store, clock)` is the one way to get a `StoreClock`. The file and memory
  stores stamp LastModified with the process's own (injected) clock, so their offset is
  zero and their store time is ``clock`` itself: tests driving a `ManualClock` on them
  keep driving time. Against a real S3 server, store time is the server's clock.

The offset is measured against the store's own clock and applied to ``clock``. In a
process every clock is the same (`SystemClock`), so that is just "the local clock plus
the offset". A test may give a caller a `ManualClock` of its own that differs from the
store's by some delta: that caller then sees store time shifted by that delta, as a host
whose view of the store is that much ahead (or behind).

Skew: a process whose clock differs from the store's by more than ``max_skew_s`` is
*skewed* (`ClockOffset.skewed`, judged only when the whole measured interval lies beyond
the limit, so the Date header's resolution never raises a false alarm). Entering and
leaving that state is logged; collectors refuse to stamp ``accepted_at`` while it lasts
and export the measured skew as a metric, as does the reconciler.
"""

from __future__ import annotations

from email.utils import parsedate_to_datetime

import structlog

from protocol.clock import Clock

log = structlog.get_logger(__name__)

NS = 1_000_000_000
DATE_RESOLUTION_NS = NS
"""The HTTP ``Date`` header counts whole seconds."""
DEFAULT_MAX_CLOCK_SKEW_S = 10.0
MAX_DRIFT = 1e-3
"""How far two clocks may drift apart, per unit of time: 1000 ppm, ten times what a
quartz clock drifts and twice the fastest NTP slew."""


def _date_ns(date_header: str) -> int | None:
    """An HTTP ``Date`` as ns since the epoch; None when unreadable or without a zone."""
    try:
        stamped = parsedate_to_datetime(date_header)
    except (TypeError, ValueError):
        log.debug("store_date_unreadable", date=date_header)
        return None
    if stamped.tzinfo is None:  # "-0000": RFC 5322 for "UTC, origin unknown"
        return None
    return int(stamped.timestamp()) * NS


class ClockOffset:
    """Bounds on the offset ``store clock - local clock`` from the store's answers.

    Unknown (no answer with a readable ``Date`` yet) counts as zero and never as skewed.
    """

    def __init__(self, *, max_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S) -> None:
        if max_skew_s <= 0:
            raise ValueError(f"max_skew_s must be > 0, got {max_skew_s}")
        self.max_skew_s = max_skew_s
        self._low_ns = self._high_ns = 0
        self._at_ns: int | None = None  # local time of the newest answer
        self._skewed = False
        self._last_date_header: str | None = None  # the last Date parsed, and its value
        self._last_date_ns: int | None = None

    def observe(self, date_header: str, *, sent_ns: int, answered_ns: int) -> None:
        """Take the ``Date`` header of an answer to a request sent at ``sent_ns`` and
        answered at ``answered_ns`` (local clock). An unreadable header is ignored."""
        if date_header == self._last_date_header:  # 1-s resolution: answers repeat it
            date_ns = self._last_date_ns
        else:
            date_ns = _date_ns(date_header)
            self._last_date_header, self._last_date_ns = date_header, date_ns
        if date_ns is None:
            return
        low, high = date_ns - answered_ns, date_ns + DATE_RESOLUTION_NS - sent_ns
        kept = self.bounds_at(answered_ns)
        if kept is not None and low <= kept[1] and kept[0] <= high:
            low, high = max(low, kept[0]), min(high, kept[1])
        self._low_ns, self._high_ns, self._at_ns = low, high, answered_ns
        self._note_skew()

    def bounds_at(self, local_ns: int) -> tuple[int, int] | None:
        """``(lowest, highest)`` possible offset in ns at local time ``local_ns``, or
        ``None`` before any answer."""
        if self._at_ns is None:
            return None
        widen = int(max(0, local_ns - self._at_ns) * MAX_DRIFT)
        return self._low_ns - widen, self._high_ns + widen

    @property
    def skew_s(self) -> float | None:
        """Best estimate of ``local clock - store clock`` in seconds (positive: this host
        runs ahead), as of the newest answer; ``None`` before any answer."""
        if self._at_ns is None:
            return None
        return -(self._low_ns + self._high_ns) / 2 / NS

    @property
    def skewed(self) -> bool:
        """True when the local clock certainly differs from the store's by more than
        ``max_skew_s`` (as of the newest answer)."""
        return self._skewed

    def _note_skew(self) -> None:
        limit_ns = self.max_skew_s * NS
        skewed = self._low_ns > limit_ns or self._high_ns < -limit_ns
        if skewed != self._skewed:
            self._skewed = skewed
            event = "store_clock_skewed" if skewed else "store_clock_skew_resolved"
            (log.warning if skewed else log.info)(
                event, skew_s=round(self.skew_s or 0.0, 3), max_clock_skew_s=self.max_skew_s
            )


class StoreClock:
    """A `Clock` in store time: ``local`` plus the measured offset (see the module doc).

    ``monotonic`` and ``sleep`` are ``local``'s: only wall-clock readings change.
    """

    def __init__(self, local: Clock, offset: ClockOffset | None = None) -> None:
        self.local = local
        self.offset = offset

    def now_ns(self) -> int:
        """Store time: the earliest the store's clock can read now."""
        return self._bounded(0)

    def latest_ns(self) -> int:
        """The latest the store's clock can read now (for a holder's own deadlines)."""
        return self._bounded(1)

    def _bounded(self, which: int) -> int:
        local_ns = self.local.now_ns()
        bounds = None if self.offset is None else self.offset.bounds_at(local_ns)
        return local_ns + (0 if bounds is None else bounds[which])

    def monotonic(self) -> float:
        return self.local.monotonic()

    async def sleep(self, seconds: float) -> None:
        await self.local.sleep(seconds)

    @property
    def skew_s(self) -> float | None:
        """``local clock - store clock`` in seconds, as last measured; ``None`` when
        unknown, and always for stores whose clock is this process's (file, memory)."""
        return None if self.offset is None else self.offset.skew_s

    @property
    def skewed(self) -> bool:
        """True while this process's clock is off the store's by more than the limit."""
        return self.offset is not None and self.offset.skewed


def store_clock(store: object, clock: Clock) -> StoreClock:
    """``clock`` as store time for ``store``. A `StoreClock` is returned as it is.

    The offset is the store's ``clock_offset`` (a `ClockOffset`; `store.s3.S3Store` has
    one), looking through wrappers that keep the wrapped store in ``inner`` (as
    ``chaos.faulty_store.FaultyStore`` does); stores without one have offset zero.
    """
    if isinstance(clock, StoreClock):
        return clock
    seen: object | None = store
    while seen is not None:
        offset = getattr(seen, "clock_offset", None)
        if isinstance(offset, ClockOffset):
            return StoreClock(clock, offset)
        seen = getattr(seen, "inner", None)
    return StoreClock(clock)
