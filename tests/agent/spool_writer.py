"""Child process for the crash tests: appends frames to a spool, announcing each one on
standard output only after `BatchProducer.submit` returned (the producer's "ack").

    python -m tests.agent.spool_writer SPOOL_DIR AGENT_ID [--die-before-rename N]

Runs until killed. ``--die-before-rename N``: SIGKILL itself inside the Nth append,
after the temporary file was written and fsync'd but before its rename.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from agent.producer import BatchProducer
from agent.spool import Spool
from protocol.frame_encode import points_table


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("spool_dir")
    parser.add_argument("agent_id")
    parser.add_argument("--die-before-rename", type=int)
    args = parser.parse_args()
    spool = Spool.open(args.spool_dir, max_pending_frames=1_000_000)
    producer = BatchProducer(agent_id=args.agent_id, spool=spool)
    print(json.dumps({"boot_id": str(producer.boot_id)}), flush=True)
    appends = 0
    real_rename = os.rename

    def rename(src: str, dst: str) -> None:
        if args.die_before_rename is not None and appends + 1 == args.die_before_rename:
            os.kill(os.getpid(), signal.SIGKILL)
        real_rename(src, dst)

    os.rename = rename  # type: ignore[assignment]
    batch = 0
    while True:
        rows = 1 + batch % 7  # varying sizes, so seq ranges differ in length
        table = points_table(
            [1_760_000_000_000_000_000 + batch * 10 + i for i in range(rows)],
            ["crash_test"] * rows,
            [float(batch)] * rows,
            [{"batch": str(batch)}] * rows,
        )
        entry = producer.submit(table)
        appends += 1
        ack = {
            "name": entry.name,
            "sha": entry.frame_sha256,
            "seq_start": entry.identity.seq_start,
            "seq_end": entry.identity.seq_end,
        }
        sys.stdout.write(json.dumps(ack) + "\n")
        sys.stdout.flush()
        batch += 1


if __name__ == "__main__":
    main()
