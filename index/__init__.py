"""The index of PROTOCOL §3.7: log rows and segments collectors write (`rows`, `log_writer`),
their reading (`log_reader`), the catalog the reconciler keeps (`catalog*`), digests and
the audits' records. Imports `protocol`, `store`, `config` only.
"""
