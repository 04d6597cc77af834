"""One rollup run (``lm-rollup run``, ``spark-submit``): planning in DuckDB, the Spark stages
and what executors exchange, then the commit through `rollup.table.commit` (`run`), the
Iceberg publish and the compaction a run may trigger. Imports `rollup.table`,
`rollup.iceberg`, `rollup.lifecycle`; the only package (with `cli`) that imports Spark.
"""
