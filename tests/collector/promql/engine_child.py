"""A stand-in collector process for the supervision tests: runs a `SupervisedEngine`
(reading from a closed port: the engine starts and is ready without reads), writes
``{"engine_pid", "dir"}`` to READY_FILE once it is ready, stops it cleanly on SIGTERM.

    python -m tests.collector.promql.engine_child PROMETHEUS_BINARY READY_FILE
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

from collector.auth import EngineReadToken
from collector.promql.engine import SupervisedEngine
from collector.promql.engine_setup import engine_memory_limit
from config.query_settings import PromqlSettings, QuerySettings


async def run(binary: Path, ready_file: Path) -> None:
    engine = SupervisedEngine(
        binary=binary,
        settings=PromqlSettings(prometheus=binary),
        max_concurrency=1,
        read_token=EngineReadToken.generate(),
        memory_limit_bytes=engine_memory_limit(QuerySettings()),
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await engine.start("http://127.0.0.1:9/api/v1/read")
    await engine.wait_ready(30)
    temporary = ready_file.with_suffix(".tmp")
    temporary.write_text(json.dumps({"engine_pid": engine.pid, "dir": str(engine.directory)}))
    temporary.replace(ready_file)
    await stop.wait()
    await engine.stop()


if __name__ == "__main__":
    asyncio.run(run(Path(sys.argv[1]), Path(sys.argv[2])))
