"""The rollup dataset as stored (PROTOCOL §4, §4.1): table schemas and how a frame's points
and one-minute partials become their rows; the snapshot model and its one transition
(`manifest`, `manifest_ledger`, `tombstones`, their codec); the owner lease and the pointer
compare-and-swap that commits a snapshot (`commit`: **where the rollup commits**); ledger
files; the store as a pyarrow filesystem. Imports only `protocol`, `store`, `index`, `config`.
"""
