"""The full audit's join engines (PROTOCOL §3.9 "Joins"): the joins as SQL text both
engines run (`sql`; bundles' ranges and dead bytes in `sql_bundles`), what the acts need
of an engine (`engine`, a Protocol), the result files and the queries over them both
share (`result_files`), the local engine on DuckDB out of core (`duckdb_joins`), and the
Spark engine — its run
(`spark_run`), listing of ranges on executors (`spark_listing`), joins as DataFrames
(`spark_joins`), executors' tasks (`spark_tasks`) and result files (`spark_results`).
Its ``spark-submit`` entry file stays at ``reconciler/audit/spark_entry.py`` (copied by
path into ``dist/``, `rollup.job.pyfiles`).

Imports what `reconciler.audit` may, and the audit's own modules.
"""
