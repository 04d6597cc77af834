"""Build what ``spark-submit`` ships to a cluster: the project's packages as one zip for
``--py-files``, and the ``.py`` entry file beside it.

    python -m rollup.job.pyfiles --out dist/
    spark-submit --master spark://HOST:7077 --py-files dist/lightmetrics-rollup.zip \\
        dist/spark_entry.py --config rollup.toml

`PACKAGES` are the project's packages the driver and the executors import: the closure of
`rollup.job.spark_entry` (the job, its stages and the S3 store) — ``tests/rollup/
test_pyfiles.py`` imports them from the zip alone in a fresh interpreter, so a package
missing here fails there. Third-party dependencies (pyarrow, pandas, zstandard, pydantic,
botocore, ...) are not in the zip: every executor's Python needs them installed (the
``[rollup]`` extra), or a packed environment shipped with ``--archives``.

``--audit`` builds the same for the reconciler's Spark audit engine instead
(``lightmetrics-audit.zip`` with `AUDIT_PACKAGES`, and ``audit_spark_entry.py``, a copy of
``reconciler/audit/spark_entry.py``): the files are copied by name, nothing here imports
the reconciler.

The zip is reproducible: entries sorted, one fixed timestamp, no ``__pycache__``; the
same sources give the same bytes (and the same sha256, printed), so an operator can tell
which build a cluster ran. Only ``.py`` files and the packages' other source files go in;
nothing in them reads a file next to its module, which zipimport could not serve.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("config", "index", "protocol", "rollup", "store")
ZIP_NAME = "lightmetrics-rollup.zip"
ENTRY_NAME = "spark_entry.py"
AUDIT_PACKAGES = (*PACKAGES, "reconciler")
AUDIT_ZIP_NAME = "lightmetrics-audit.zip"
AUDIT_ENTRY_NAME = "audit_spark_entry.py"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say: the same bytes every build
_SKIPPED_DIRS = {"__pycache__"}
_SKIPPED_SUFFIXES = {".pyc", ".pyo"}


@dataclass(frozen=True, slots=True)
class PyFiles:
    """A build: the zip for ``--py-files``, the entry file, and the zip's sha256."""

    zip_path: Path
    entry_path: Path
    sha256: str
    modules: int


def build_pyfiles(
    out_dir: Path, *, source_root: Path | None = None, audit: bool = False
) -> PyFiles:
    """Write ``out_dir/lightmetrics-rollup.zip`` (`PACKAGES` from ``source_root``,
    default: where this package is imported from) and ``out_dir/spark_entry.py`` (a copy
    of `rollup.job.spark_entry`); with ``audit``, the audit's zip and entry (module doc).
    Raises `FileNotFoundError` when a package is not there."""
    root = source_root if source_root is not None else Path(__file__).resolve().parents[2]
    out_dir.mkdir(parents=True, exist_ok=True)
    files = sorted(_package_files(root, AUDIT_PACKAGES if audit else PACKAGES))
    zip_path = out_dir / (AUDIT_ZIP_NAME if audit else ZIP_NAME)
    temporary = zip_path.with_suffix(".zip.tmp")
    with zipfile.ZipFile(temporary, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for relative in files:
            info = zipfile.ZipInfo(relative.as_posix(), date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, (root / relative).read_bytes())
    temporary.replace(zip_path)  # never a half-written zip under the shipped name
    entry_path = out_dir / (AUDIT_ENTRY_NAME if audit else ENTRY_NAME)
    entry = ("reconciler", "audit", "spark_entry.py") if audit else ("rollup", "job", ENTRY_NAME)
    entry_path.write_bytes(root.joinpath(*entry).read_bytes())
    return PyFiles(
        zip_path=zip_path,
        entry_path=entry_path,
        sha256=hashlib.sha256(zip_path.read_bytes()).hexdigest(),
        modules=sum(1 for f in files if f.suffix == ".py"),
    )


def _package_files(root: Path, packages: tuple[str, ...]) -> list[Path]:
    found: list[Path] = []
    for package in packages:
        directory = root / package
        if not (directory / "__init__.py").is_file():
            raise FileNotFoundError(f"package {package!r} not found under {root}")
        for path in directory.rglob("*"):
            relative = path.relative_to(root)
            if (
                path.is_file()
                and path.suffix not in _SKIPPED_SUFFIXES
                and not _SKIPPED_DIRS.intersection(relative.parts)
            ):
                found.append(relative)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rollup.job.pyfiles",
        description="Build the --py-files zip and the entry file for spark-submit.",
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--audit", action="store_true", help="the reconciler's Spark audit")
    args = parser.parse_args(argv)
    try:
        built = build_pyfiles(args.out, audit=args.audit)
    except (FileNotFoundError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{built.zip_path}  ({built.modules} modules, sha256 {built.sha256})")
    print(built.entry_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
