"""The base of every JSON record (`protocol.records`): frozen, validated, unknown fields
ignored, compact JSON with ``schema`` first; `RecordError` names the record and problem."""

from __future__ import annotations

import json
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from protocol import keys

Sha256Hex = Field(pattern=r"^[0-9a-f]{64}$")
U64 = Field(ge=0, le=keys.MAX_U64)
NonNegative = Field(ge=0)


class RecordError(ValueError):
    """A stored JSON record is malformed or inconsistent."""


class Record(BaseModel):
    """Base: frozen, validated, ignores unknown fields, compact JSON."""

    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)
    _omit_when_none: ClassVar[frozenset[str]] = frozenset()
    """Optional fields added to a record after v1 shipped: left out of the JSON when
    unset, so a record without them is written byte for byte as before."""

    def to_json(self) -> bytes:
        """Compact JSON with ``schema`` first, as PROTOCOL shows the records."""
        fields = self.model_dump(mode="json", by_alias=True)
        for name in self._omit_when_none:
            if fields.get(name, 0) is None:
                del fields[name]
        if "schema" in fields:
            fields = {"schema": fields.pop("schema"), **fields}
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes | str) -> Self:
        return cls._from_json(data)

    @classmethod
    def _from_json(cls, data: bytes | str, context: dict[str, Any] | None = None) -> Self:
        """`from_json` with a validation context (a reader's opt-in to a newer form)."""
        try:
            return cls.model_validate_json(data, context=context)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<record>'}: {err['msg']}"
                for err in exc.errors()
            )
            raise RecordError(f"invalid {cls.__name__}: {problems}") from None

    @classmethod
    def _validate(cls, fields: dict[str, Any], context: dict[str, Any]) -> Self:
        """Construct from `fields` with a validation context (pydantic's ValidationError,
        a ValueError, as the constructor raises)."""
        return cls.model_validate(fields, context=context)
