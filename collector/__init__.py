"""The collector daemon (``lm-collector``, PROTOCOL §2, §3.2-§3.4): authorization (`auth`,
`intake`), a frame's acceptance in two conditional PUTs (`accept`, `quarantine`,
`blob_survival`), the local spool mode (`spool*`), the HTTP app and server (`app`,
`server`, `launch`), metrics; `receivers/` (remote_write, OTLP) and `query/` (live
queries) depend on this core, never the other way. Imports `protocol`, `store`, `index`,
`config`, and the rollup's `table`/`read` (for `query/` only).
"""
