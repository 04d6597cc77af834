"""The local engine's spill directories (`reconciler.audit.spill`): one a crashed audit
left is removed by the next audit; one a live audit (of any process) holds is kept."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from reconciler.audit.spill import LOCK, PREFIX, spill_directory, sweep


def test_a_killed_audits_directory_is_swept_and_a_live_ones_kept(tmp_path: Path) -> None:
    # A child process takes a spill directory, then is killed with SIGKILL mid-audit.
    code = (
        "import os, sys, time; from reconciler.audit.spill import spill_directory\n"
        "with spill_directory(sys.argv[1]) as d:\n"
        "    open(os.path.join(d, 'copy.parquet'), 'wb').write(b'x' * 1000)\n"
        "    print(d, flush=True); time.sleep(600)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        crashed = child.stdout.readline().strip()
        assert os.path.isdir(crashed) and Path(crashed).name.startswith(PREFIX)
        assert sweep(str(tmp_path)) == []  # alive: its lock is held
        child.kill()
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        if child.stdout is not None:
            child.stdout.close()
    with spill_directory(str(tmp_path)) as live:  # the next audit sweeps the dead one
        assert not os.path.exists(crashed)
        assert os.path.isfile(os.path.join(live, LOCK))
        assert sweep(str(tmp_path)) == []  # this one is held (by this process)
        with open(os.path.join(live, LOCK), "rb+") as other:  # as another process would
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("the live directory's lock was free")
            except BlockingIOError:
                pass
    assert os.listdir(tmp_path) == []  # the live one removed at its end
    (tmp_path / f"{PREFIX}nolock").mkdir()  # crashed before its lock existed
    assert sweep(str(tmp_path)) == [str(tmp_path / f"{PREFIX}nolock")]
    (tmp_path / "unrelated").mkdir()
    assert sweep(str(tmp_path)) == [] and os.listdir(tmp_path) == ["unrelated"]
