"""The full audit (PROTOCOL §3.7, §3.9): `run` (`run_full_audit`: **the audit's steps**,
resumable from its `records`), its inputs (`ranges`, `listing`, `inventory`, `audit_inputs`;
`partitions` closes listings), the joins (`sql` run by `duckdb_joins`, `retired`; what the
acts need of an engine: `engine`) and what the audit does with their results
(`records_act`, `blobs_act`), the Spark engine (`spark_run`: its listing `spark_listing`,
joins `spark_joins`, executors' tasks `spark_tasks`, result files `spark_results`,
``spark-submit`` entry `spark_entry`), the
orphan file the GC reads (`orphans`), blob verification (`blob_verify`, `rate`), the schedule
(`schedule`), and the child process the daemon runs it in (`child`, `worker`, `wire`).
Imports `protocol`, `store`, `index`, `config` and the reconciler's shared modules
(`context`, `cataloger`, `store_calls`, `problems`); never `reconciler.gc` except
`gc.raw_retention`'s retired hours and `gc.catalog_since`'s entry listing.
"""
