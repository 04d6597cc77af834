"""`chaos.catalog_rows` (a catalog hour as Python row objects) stays out of the product:
PROTOCOL §3.9 forbids one Python object per row for a catalog hour there."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("collector", "reconciler", "rollup", "index", "store", "protocol", "config", "agent")


def test_no_product_module_reads_a_catalog_hour_as_row_objects() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        if "from chaos.catalog_rows import" in path.read_text(encoding="utf-8")
    ]
    assert offenders == []
