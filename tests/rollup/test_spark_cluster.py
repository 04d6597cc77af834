"""The rollup on a real Spark standalone cluster: a master and two workers (separate JVMs,
`tests.rollup.spark_cluster`), the project shipped to the executors as a built zip
through ``--py-files``, the store on MiniStack (S3 is all the executors share with the
driver)."""

from __future__ import annotations

import os

from tests.rollup.spark_cluster import WORKER_CORES, StandaloneCluster


def test_the_cluster_registers_two_workers(spark_cluster: StandaloneCluster) -> None:
    state = spark_cluster.state()
    assert state["status"] == "ALIVE" and state["url"] == spark_cluster.master_url
    alive = [w for w in state["workers"] if w["state"] == "ALIVE"]
    assert len(alive) == 2 and state["aliveworkers"] == 2
    assert {w["host"] for w in alive} == {"127.0.0.1"}
    assert [w["cores"] for w in alive] == [WORKER_CORES] * 2
    assert [w["memory"] for w in alive] == [1024, 1024]
    # Three JVMs, each the leader of its own process group (stopped as one).
    pids = [d.process.pid for d in [spark_cluster.master, *spark_cluster.workers]]
    assert len(set(pids)) == 3
    assert all(os.getpgid(pid) == pid for pid in pids)
