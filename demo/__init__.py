"""``lm-demo``: the whole story on the embedded filesystem store, one step a module
(receivers, reconcile, rollup, query, lifecycle). May import every package.
"""
