"""Changing the dataset without a run (PROTOCOL §4.1): deletes (tombstones), compaction,
vacuum of objects no retained snapshot needs, acknowledging lost batches. Each commits
through `rollup.table.commit`. Imports `rollup.table`, `rollup.read`, `rollup.iceberg`.
"""
