"""What ``lm-reconciler status`` says of bundles (PROTOCOL §3.10): their listed, dead and
pinned bytes, as the last completed audit recorded them (no request of its own)."""

from __future__ import annotations

from typing import Any

from protocol.records import AuditRecord


def bundle_bytes(record: AuditRecord | None) -> dict[str, Any] | None:
    """The bundles of the last completed audit's listing (PROTOCOL §3.10): how many, their
    listed bytes, the *dead* bytes (listed size less the ranges rows name: duplicates'
    frames, indexes and footers; no GET) and the *pinned* bytes (bundles some of whose
    frames raw retention retired while another naming frame is not: a bundle goes only
    whole, so a frame that never retires keeps it all). Figures an audit did not record
    (one written before bundles) are None. None when no audit listed a bundle."""
    if record is None:
        return None
    fields = record.model_dump()
    if not fields.get("bundles_listed"):
        return None
    return {
        "audit_id": record.audit_id,
        "bundles": fields.get("bundles_listed"),
        "bytes": fields.get("bundle_bytes"),
        "dead_bytes": fields.get("bundle_dead_bytes"),
        "pinned_bytes": fields.get("bundle_pinned_bytes"),
    }


def bundle_line(bundles: dict[str, Any]) -> str:
    def mib(value: int | None) -> str:
        return "-" if value is None else f"{value / 2**20:.1f} MiB"

    return (
        f"{bundles['bundles']} bundles, {mib(bundles['bytes'])} listed, "
        f"{mib(bundles['dead_bytes'])} dead, {mib(bundles['pinned_bytes'])} pinned "
        f"(audit {bundles['audit_id']})"
    )
