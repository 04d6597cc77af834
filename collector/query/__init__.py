"""The live query endpoint (``GET /v1/query``, PROTOCOL §2): parameters and answers
(`api`, `rows`), the committed rollup snapshot (`committed`), the live window of recent
batches and where they come from (`window`, `decode`, `sources`, `late`, `coverage`),
the HTTP endpoint (`endpoint`), its wiring (`setup`) and the ``lm-collector query`` CLI
(`cli`). It may import the acceptance core (`collector.auth`, `intake`, `metrics`,
`params`), `index`, `rollup`'s readers, `store` and `protocol`; the core never imports it
(only `collector.app`/`server`/`__main__`, which assemble the process, do).
"""
