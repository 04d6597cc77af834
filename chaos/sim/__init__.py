"""The deterministic simulation: whole worlds of agents, collectors, the reconciler and the
store on virtual time, one seed deciding every choice (issue 7; bundles, issue 33).

- `chaos.sim.simulation`: `simulate(config)`, the run and its end-state checks, and the
  planted faults no correct writer leaves;
- `chaos.sim.config`: `SimConfig`, the world's knobs, and `SimReport`;
- `chaos.sim.world`: the collectors, the reconciler, the rollup and the watched store;
- `chaos.sim.agents`: the agents (re-sends, conflicts, races, orphans, crash landings);
- `chaos.sim.frames`: a batch's header and a valid frame of its identity;
- `chaos.sim.spool`: agents of a local-spool collector and its landings (PROTOCOL §3.4);
- `chaos.sim.retention`: the rollup stand-in raw retention needs;
- `chaos.sim.checks`: the store watch and the end-state checks;
- `chaos.sim.runtime`: the virtual-time event loop, its clock and seeded latency.
"""
