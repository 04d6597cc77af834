"""`python -m bench.promql`: the Prometheus read path (issue 32) against a reference Prometheus."""
