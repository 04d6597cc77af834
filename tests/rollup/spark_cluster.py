"""A Spark standalone cluster on 127.0.0.1 for tests: the launcher of
`chaos.spark_standalone` (it lives in an installed package so benchmarks can use it too;
see that module for what the master, workers and submitted jobs are given)."""

from __future__ import annotations

from chaos.spark_standalone import (
    WORKER_CORES,
    WORKER_MEMORY,
    ClusterStartError,
    StandaloneCluster,
    python_without_the_project,
    spark_submit,
    start_cluster,
)

__all__ = [
    "WORKER_CORES",
    "WORKER_MEMORY",
    "ClusterStartError",
    "StandaloneCluster",
    "python_without_the_project",
    "spark_submit",
    "start_cluster",
]
