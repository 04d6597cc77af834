"""The frames of a simulated world: a batch's header (`SimHeader`) and a valid frame of
its identity (`sim_frame`), shared by the agents, the planted faults and the spool world
(`chaos.sim.agents`, `chaos.sim.simulation`, `chaos.sim.spool`) and the long run."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from protocol import keys
from protocol.frame_encode import encode_frame, points_table


@dataclass(frozen=True, slots=True)
class SimHeader:
    agent_id: str
    boot_id: uuid.UUID
    seq_start: int
    seq_end: int
    record_count: int

    @property
    def identity(self) -> keys.BatchIdentity:
        return keys.BatchIdentity(self.agent_id, self.boot_id, self.seq_start, self.seq_end)


def sim_frame(header: SimHeader, seed: int, variant: str) -> bytes:
    """A valid frame of ``header``'s identity (the GC's proof reads a blob's identity from
    its header, PROTOCOL §3.5 rule 7); ``variant`` gives another frame of that identity."""
    rows = header.record_count
    table = points_table(
        [1_760_000_000 * keys.NS_PER_S + i for i in range(rows)],
        ["sim"] * rows,
        [float(i) for i in range(rows)],
        [{"seed": str(seed), "variant": variant}] * rows,
    )
    return encode_frame(
        agent_id=header.agent_id, boot_id=header.boot_id, seq_start=header.seq_start, points=table
    )
