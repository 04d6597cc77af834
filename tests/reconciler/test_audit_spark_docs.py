"""docs/scaling.md's commands for the audit's Spark engine name what exists: the zip and
entry file ``python -m rollup.job.pyfiles --audit`` builds are the ones ``spark-submit``
is given, and ``lm-reconciler ... audit --engine spark`` parses (the cluster test,
test_audit_spark_cluster.py, runs the same build and submit)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from reconciler.__main__ import build_parser
from rollup.job.pyfiles import main as pyfiles_main

DOC = Path(__file__).resolve().parents[2] / "docs" / "scaling.md"


def commands() -> list[list[str]]:
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    [block] = [b for b in blocks if "pyfiles --audit" in b]
    joined = block.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def test_the_documented_build_gives_what_spark_submit_is_given(tmp_path: Path) -> None:
    build, submit, local = [c for c in commands() if c]
    assert build[:3] == ["python", "-m", "rollup.job.pyfiles"]
    out = tmp_path / "dist"
    assert pyfiles_main([*build[3:-1], str(out)]) == 0
    assert build[-2:] == ["--out", "dist/"]
    assert submit[0] == "spark-submit"
    shipped = [a for a in submit if a.startswith("dist/")]
    assert shipped and all((out / Path(a).name).is_file() for a in shipped)
    assert submit[submit.index("--py-files") + 1].endswith(".zip")
    assert local[0] == "lm-reconciler"
    args = build_parser().parse_args(local[1:])
    assert (args.command, args.engine) == ("audit", "spark")
