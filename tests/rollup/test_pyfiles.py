"""`rollup.job.pyfiles` builds a zip that is all the job needs of this project: a fresh
interpreter that cannot see the source tree imports the job from the zip alone."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

from rollup.job.pyfiles import PACKAGES, build_pyfiles, main
from tests.rollup.spark_cluster import python_without_the_project

# The driver's modules and the ones executors import to run the stages' functions.
JOB_MODULES = (
    "rollup.job.spark_entry",
    "rollup.job.frame_stage",
    "rollup.job.hour_stage",
    "rollup.job.stages",
    "rollup.job.tasks",
    "store.s3",
)
REPO_ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import json, sys
for name in sys.argv[1:]:
    __import__(name)
found = {n: m.__file__ for n, m in sys.modules.items() if n.split(".")[0] in %r}
print(json.dumps({"found": found, "path": sys.path}))
"""


def test_the_zip_alone_provides_the_job(tmp_path: Path) -> None:
    built = build_pyfiles(tmp_path / "dist")
    python = python_without_the_project(tmp_path / "bin")
    completed = subprocess.run(
        [str(python), "-c", PROBE % (PACKAGES,), *JOB_MODULES],
        env={"PYTHONPATH": str(built.zip_path), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,  # not the repository
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(completed.stdout)
    assert set(JOB_MODULES) <= set(report["found"])
    outside = {n: f for n, f in report["found"].items() if not f.startswith(f"{built.zip_path}/")}
    assert outside == {}, outside
    assert {name.split(".")[0] for name in report["found"]} == set(PACKAGES)


def test_the_build_is_reproducible_and_has_no_bytecode(tmp_path: Path) -> None:
    first = build_pyfiles(tmp_path / "a")
    second = build_pyfiles(tmp_path / "b")
    assert first.sha256 == second.sha256
    assert first.zip_path.read_bytes() == second.zip_path.read_bytes()
    with zipfile.ZipFile(first.zip_path) as archive:
        names = archive.namelist()
    assert names == sorted(names)
    assert {name.split("/")[0] for name in names} == set(PACKAGES)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert (
        first.entry_path.read_bytes()
        == (REPO_ROOT / "rollup" / "job" / "spark_entry.py").read_bytes()
    )


def test_the_command_line_writes_both_files(tmp_path: Path) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    assert (tmp_path / "lightmetrics-rollup.zip").is_file()
    assert (tmp_path / "spark_entry.py").is_file()
    assert not list(tmp_path.glob("*.tmp"))
