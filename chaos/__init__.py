"""Chaos testing (``lm-chaos``): real collectors, reconciler and rollup as processes over a
fault-injecting store proxy (`proxy`, `faulty_store`, `faults`), scenarios
(`scenarios/`), the invariant auditor (`auditor`, `index_checks`, `rollup_check`), and the
seeded deterministic simulation (`sim_*`, `simulation`). May import every package.
"""
