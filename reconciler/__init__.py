"""The reconciler daemon (PROTOCOL §3.5, §3.7): `daemon` runs the steady pass (`steady`,
`steady_rows`, `cataloger`), catalog `compaction`, log retention, `status` and `problems`;
`audit/` is the full audit, `gc/` garbage collection (**where the GC decides to delete**:
`gc/deletion.py`, then `gc/proof.py` and `gc/delete.py`). Imports `protocol`, `store`,
`index`, `config`, and the rollup's `table`/`read` (raw retention and the GC read the
committed ledger); never `collector`, `chaos` or `bench`.
"""
