"""Group commit (PROTOCOL §3.10): many checked frames in one raw object, a bundle.

`bundler` (the open bundle, write slots, closing, deadlines, backpressure),
`bundle_write` (the bundle's one conditional PutObject and its outcomes), `options`
(what the acceptor is given: limits, the store's feature gate, metrics).
"""
