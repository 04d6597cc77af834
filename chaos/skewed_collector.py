"""``python -m chaos.skewed_collector serve ...``: an ``lm-collector`` whose wall clock is
off by ``CHAOS_CLOCK_SKEW_S`` seconds (positive: ahead), for the clock-skew scenario.

Only the collector's injected clock (`protocol.clock.SystemClock.now_ns`) is shifted:
manifest ``accepted_at``, its index log rows and segment names (so the reconciler's
lookback may miss them: the full audit catalogs their records) and its vetoes carry the
skewed time, as they would on a host with a wrong clock. Request signing (botocore) and
timeouts keep the real clock; the S3 servers we test against do not check signature
times anyway.
"""

from __future__ import annotations

import os
import sys

from protocol import clock

SKEW_ENV = "CHAOS_CLOCK_SKEW_S"


def main() -> int:
    skew_ns = int(float(os.environ.get(SKEW_ENV, "0")) * 1_000_000_000)
    if skew_ns:
        real_now_ns = clock.SystemClock.now_ns

        def skewed_now_ns(self: clock.SystemClock) -> int:
            return real_now_ns(self) + skew_ns

        clock.SystemClock.now_ns = skewed_now_ns  # type: ignore[method-assign]
    from collector.__main__ import main as collector_main

    return collector_main()


if __name__ == "__main__":
    sys.exit(main())
