"""Reading the dataset without Spark: a snapshot's files pruned and filtered (`reader`),
reader leases that pin a snapshot, time travel (`travel`, `chain_index`), DuckDB SQL
(`sql`), history, and ``verify``'s proof of exactly-once (`verify`, with where its batches
come from, `verify_sources`, and its out-of-core ledger checks, `verify_ledger`). Imports
`rollup.table` only.
"""
