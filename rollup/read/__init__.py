"""Reading the dataset without Spark: a snapshot's files pruned and filtered (`reader`),
reader leases that pin a snapshot, time travel (`travel`, `chain_index`), DuckDB SQL
(`sql`), history, and ``verify``'s proof of exactly-once. Imports `rollup.table` only.
"""
