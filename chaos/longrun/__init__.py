"""The long simulated run of issue 31: one world, days long, on virtual time.

- `chaos.longrun.run`: `run_longrun` and its report (the entry point; ``lm-chaos longrun``);
- `chaos.longrun.config`: the world's knobs, its two sizes (``FULL``, ``CI``) and settings;
- `chaos.longrun.world`: the collectors (killed, dying in a flush), the reconciler daemon,
  the agents and the orphans;
- `chaos.longrun.stores`: a collector process's store (`ProcessGate`) and S3-like request
  timeouts;
- `chaos.longrun.ledger_rollup`: the rollup stand-in, by the index's rule for which row
  counts;
- `chaos.longrun.watch`: the timeline kept from the store's operations;
- `chaos.longrun.figures`: the figures, the claims judged on them, and how they print.

It builds on the short simulation (`chaos.sim.simulation`): its runtime, checks and stores.
"""
