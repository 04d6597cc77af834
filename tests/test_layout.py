"""The shape of the code (DESIGN.md "Code layout"): no import cycles, dependencies that
point one way, no module over 400 lines; and the tests' one in-process Spark session.

The import graph is read from the sources with `ast` (every ``import``, also inside
functions and under ``if TYPE_CHECKING:``: a cycle that only type hints close is still a
cycle a reader has to untangle). What is still wrong is listed below, exactly: a new
violation fails, and so does a listed one that is gone (take it off the list).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "protocol",
    "config",
    "store",
    "index",
    "agent",
    "collector",
    "reconciler",
    "rollup",
    "chaos",
    "bench",
    "demo",
)
MAX_LINES = 400
MAX_MODULES_PER_FOLDER = 25
"""Rooms (issue 31 item 8): a product folder holding more modules is split into
subpackages (tests/ and bench/ mirror or measure, and are exempt)."""

# Top-level packages and what each may import (besides itself and third parties):
# protocol <- store <- index <- the daemons <- chaos, bench, demo (DESIGN.md).
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "config": set(),
    "store": {"protocol", "config"},
    "index": {"protocol", "store", "config"},
    "agent": {"protocol", "store", "config"},
    "rollup": {"protocol", "store", "index", "config"},
    "collector": {"protocol", "store", "index", "config", "rollup"},
    "reconciler": {"protocol", "store", "index", "config", "rollup"},
    "chaos": set(PACKAGES),
    "bench": set(PACKAGES),
    "demo": set(PACKAGES),
}
# The daemons read the rollup dataset through its format and readers only.
ROLLUP_FOR_DAEMONS = ("rollup.table", "rollup.read")
# rollup's rooms and what each may import (rollup/*/__init__.py say the same).
ROLLUP_ALLOWED: dict[str, set[str]] = {
    "table": set(),
    "read": {"table"},
    "iceberg": {"table"},
    "lifecycle": {"table", "read", "iceberg"},
    "job": {"table", "iceberg", "lifecycle"},
    "cli": {"table", "read", "iceberg", "lifecycle", "job"},
}

# What is still to be done (issue 25): each entry goes when it is fixed.
KNOWN_CYCLES: set[frozenset[str]] = set()
KNOWN_WRONG_WAY: set[tuple[str, str]] = set()
KNOWN_LONG: set[str] = set()


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``module`` imports (a ``from package import name`` of a
    submodule depends on the submodule, not on the package's ``__init__``)."""
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            submodules = [
                f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in modules
            ]
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(source)
    resolved = set()
    for name in found:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != module:
            resolved.add(name)
    return resolved


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {module: _imported(module, path, modules) for module, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> Iterator[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    yield frozenset(component)


def _wrong_way(importer: str, imported: str) -> bool:
    top, target = importer.split(".")[0], imported.split(".")[0]
    if top != target and target not in ALLOWED[top]:
        return True
    if target == "rollup" and top in ("collector", "reconciler"):
        return not imported.startswith(ROLLUP_FOR_DAEMONS)
    if top == target == "rollup":
        room, other = importer.split(".")[1:2], imported.split(".")[1:2]
        if room and other and room != other and room[0] in ROLLUP_ALLOWED:
            return other[0] in ROLLUP_ALLOWED and other[0] not in ROLLUP_ALLOWED[room[0]]
    return False


def test_no_import_cycles() -> None:
    cycles = set(_cycles(_graph()))
    new = {tuple(sorted(c)) for c in cycles - KNOWN_CYCLES}
    fixed = {tuple(sorted(c)) for c in KNOWN_CYCLES - cycles}
    assert not new, f"import cycles: {sorted(new)}"
    assert not fixed, f"gone (take them off KNOWN_CYCLES): {sorted(fixed)}"


def test_dependencies_point_one_way() -> None:
    wrong = {
        (importer, imported)
        for importer, targets in _graph().items()
        for imported in targets
        if _wrong_way(importer, imported)
    }
    assert not wrong - KNOWN_WRONG_WAY, (
        f"imports against DESIGN.md: {sorted(wrong - KNOWN_WRONG_WAY)}"
    )
    assert not KNOWN_WRONG_WAY - wrong, f"gone (take them off): {sorted(KNOWN_WRONG_WAY - wrong)}"


def test_no_product_folder_holds_more_than_25_modules() -> None:
    crowded = {
        str(folder.relative_to(ROOT)): count
        for package in PACKAGES
        if package != "bench"
        for folder in [ROOT / package, *(ROOT / package).rglob("*")]
        if folder.is_dir()
        and "__pycache__" not in folder.parts
        and (count := len(list(folder.glob("*.py")))) > MAX_MODULES_PER_FOLDER
    }
    assert crowded == {}


def test_no_module_over_400_lines() -> None:
    lengths = {
        m: len(p.read_text().splitlines())
        for m, p in _modules().items()
        if ".proto." not in f".{m}."  # generated by protoc (collector/receivers/proto)
    }
    long = {m for m, n in lengths.items() if n > MAX_LINES}
    assert not long - KNOWN_LONG, {m: lengths[m] for m in sorted(long - KNOWN_LONG)}
    assert not KNOWN_LONG - long, f"now short (take them off): {sorted(KNOWN_LONG - long)}"


def test_the_checker_sees_a_cycle_and_a_wrong_way_import() -> None:
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}
    assert set(_cycles(graph)) == {frozenset({"a.x", "a.y", "a.z"})}
    assert _wrong_way("store.s3", "reconciler.gc")
    assert _wrong_way("collector.query.rows", "rollup.job.run")
    assert _wrong_way("rollup.table.commit", "rollup.job.run")
    assert not _wrong_way("rollup.job.run", "rollup.table.commit")
    assert not _wrong_way("bench.cost", "reconciler.daemon")


def test_the_tests_start_their_in_process_spark_session_in_one_place() -> None:
    """Spark allows one session per process, and a pytest-xdist worker takes modules in
    any order: a module-scoped session of its own fails whenever the worker started the
    run's session first (tests/conftest.py's ``spark``, which every test shares)."""
    callers = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == "local_spark"
    }
    assert callers == {"tests/conftest.py"}
