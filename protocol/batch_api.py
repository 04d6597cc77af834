"""The names on the wire of ``POST /v1/batches`` (PROTOCOL §2) that both ends act on:
the agent sends them and the collector reads them, or the collector answers them and the
agent decides by them. One place, so the two ends cannot drift apart."""

from __future__ import annotations

BATCHES_PATH = "/v1/batches"
FRAME_CONTENT_TYPE = "application/x-lmbatch"
FRAME_MEDIA_TYPES = frozenset({FRAME_CONTENT_TYPE, "application/octet-stream"})

# ``1`` on a frame the agent sent before without a final answer (§3.2): the collector
# checks it against its accepted manifest first.
RESEND_HEADER = "X-Lightmetrics-Resend"

# 503 error codes. Both are retried; an agent with other collectors tries the next one at
# once on ``clock_skewed`` (the refusal is that collector's own clock, §3.8) and backs off
# on ``store_unavailable`` (every collector may share it).
STORE_UNAVAILABLE = "store_unavailable"
CLOCK_SKEWED = "clock_skewed"
