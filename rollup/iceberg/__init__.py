"""The committed snapshots published as Apache Iceberg tables (metadata, position-delete
files), for engines that read Iceberg. Imports `rollup.table`; called after a commit.
"""
