"""The rollup: accepted batches -> Parquet tables under a compare-and-swap snapshot
(PROTOCOL §4). `table` (the dataset as stored), `job` (one run), `lifecycle`, `read`,
`iceberg`, `cli`; see each package's docstring for what it may import.
"""
