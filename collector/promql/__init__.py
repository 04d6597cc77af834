"""The Prometheus read path (PROTOCOL §5): remote read, the names endpoints from the
`series` index, the PromQL engine's supervision and the forwarding of PromQL requests."""
