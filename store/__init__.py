"""The object store every process talks to (PROTOCOL §3.6): the `ObjectStore` protocol
(`base`), the memory, filesystem (`fs`) and S3 (`s3*`, the only modules that import
aiobotocore) stores, opened by URL (`open`); compare-and-swap objects and leases (`cas`,
`lease`), bounded retries (`retry`), store time (`time`) and errors grouped by what the
caller does (`errors`). Imports `protocol` and `config` only.
"""
