"""The README and docs/ hang together: every doc is reachable from the README, every
relative link and every repository path a doc names exists, and every Python block
compiles (the blocks that are run are run by their own tests: tests/rollup/
test_readme_reading.py; docs/scaling.md's Spark audit commands: tests/reconciler/
test_audit_spark_docs.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
PATH = re.compile(
    r"`((?:agent|bench|chaos|collector|config|deploy|docs|index|protocol|reconciler|rollup|scripts|store|tests)/[\w./-]*[\w/])`"
)


def test_the_readme_is_where_a_newcomer_starts() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert readme.startswith("# Lightmetrics ingest\n\n```bash\nscripts/demo")
    linked = {(ROOT / target).resolve() for target in LINK.findall(readme)}
    assert {doc.resolve() for doc in DOCS} <= linked, "a doc the README does not link"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_and_paths_exist(page: Path) -> None:
    text = page.read_text()
    missing = [t for t in LINK.findall(text) if "://" not in t and not (page.parent / t).exists()]
    missing += [
        p
        for p in PATH.findall(text)
        if "*" not in p
        and not re.match(r"\w+/v\d+/", p)  # object keys (``index/v1/...``)
        and not (ROOT / p).exists()
    ]
    assert not missing, f"{page.name} names what does not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_blocks_compile(page: Path) -> None:
    for number, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.S)):
        compile(block, f"{page.name} python block {number}", "exec")
