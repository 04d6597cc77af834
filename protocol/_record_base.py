"""The base of every JSON record (`protocol.records`): frozen, validated, unknown fields
ignored, compact JSON with ``schema`` first; `RecordError` names the record and problem."""

from __future__ import annotations

import json
from typing import Self

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

    def to_json(self) -> bytes:
        """Compact JSON with ``schema`` first, as PROTOCOL shows the records."""
        fields = self.model_dump(mode="json", by_alias=True)
        if "schema" in fields:
            fields = {"schema": fields.pop("schema"), **fields}
        return json.dumps(fields, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_json(cls, data: bytes | str) -> Self:
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '<record>'}: {err['msg']}"
                for err in exc.errors()
            )
            raise RecordError(f"invalid {cls.__name__}: {problems}") from None
