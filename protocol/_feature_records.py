"""The store's feature record and the version registry's entries (PROTOCOL §3.10
"Writing"). Part of `protocol.records` (``records.FeatureRecord``, ...).

Contract notes (PROTOCOL names the fields; decided here):
- ``expires_at`` is written ``expires_at_unix_ns`` (store time, as every expiry here:
  `LeaseRecord`, `RollupReaderLease`).
- A feature is a top-level **boolean** of the feature record: ``bundles`` is this version's
  only one; a boolean field this version does not know is a feature it does not implement
  (`FeatureRecord.features`). Other unknown fields are ignored, as in every record.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, StrictBool

from protocol._record_base import NonNegative, Record


class FeatureRecord(Record):
    """``index/v1/features.json``: the features in effect for this store. Written by
    ``lm-reconciler enable-bundles`` only once every process that reads records can read
    what the feature writes; never turned off (no downgrade below it)."""

    model_config = ConfigDict(frozen=True, extra="allow", populate_by_name=True)

    schema_: Literal["lightmetrics.features.v1"] = Field(
        default="lightmetrics.features.v1", alias="schema"
    )
    bundles: StrictBool = False
    """Collectors may write bundles (PROTOCOL §3.10); every reader reads ranges."""
    written_by: str = Field(min_length=1, max_length=256)
    """Who wrote the record (``lm-reconciler enable-bundles``: the OS user and host)."""
    written_at_unix_ns: int = NonNegative

    def features(self) -> dict[str, bool]:
        """Every feature the record names, on or off: ``bundles`` and each top-level
        boolean this version does not know (a later version's feature)."""
        extra: dict[str, Any] = self.model_extra or {}
        named = {name: value for name, value in extra.items() if isinstance(value, bool)}
        return {"bundles": self.bundles, **named}


class VersionEntry(Record):
    """``index/v1/versions/<role>-<id>.json``: one running process's version, written at
    its start and every minute (`index.versions`). An entry past ``expires_at_unix_ns``
    says nothing about the store any more; one without ``reads_bundles`` (parsed as
    ``False``) is a process that cannot read a bundled record."""

    schema_: Literal["lightmetrics.version_entry.v1"] = Field(
        default="lightmetrics.version_entry.v1", alias="schema"
    )
    version: str = Field(min_length=1, max_length=128)
    reads_bundles: StrictBool = False
    expires_at_unix_ns: int = NonNegative
