"""Receivers: metrics from senders that do not speak the frame format, turned into frames.

- ``POST /api/v1/write``: Prometheus remote_write v1 (`collector.receivers.remote_write`);
- ``POST /v1/metrics``: OTLP/HTTP metrics, protobuf or JSON (`collector.receivers.otlp`).

Each request becomes at most one frame, under an identity derived from its points
(`collector.receivers.frames`), and goes through the same checks, limits, in-flight caps
and acceptance as ``POST /v1/batches`` (`collector.receivers.intake`,
`collector.receivers.landing`). `add_receiver_routes` registers them on the collector's
application (``[receivers] enabled``). Imports the acceptance core (`collector.intake`,
`accept`, `metrics`, ...), `protocol`, `store`, `config`; the core never imports it.
"""

from collector.receivers.routes import ReceiverMetrics, add_receiver_routes

__all__ = ["ReceiverMetrics", "add_receiver_routes"]
