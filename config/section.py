"""What every settings section shares: immutable, unknown keys rejected, defaults
validated; paths made absolute against the working directory; seconds and ports."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

MiB = 1024 * 1024


def _not_empty(value: Any) -> Any:
    # Path("") is ".", which would silently become the working directory.
    if isinstance(value, str) and not value.strip():
        raise ValueError("must not be empty (leave the key out instead)")
    return value


def _absolute(path: Path) -> Path:
    return Path(os.path.abspath(path))


AbsolutePath = Annotated[Path, BeforeValidator(_not_empty), AfterValidator(_absolute)]
"""A path made absolute against the working directory at validation time."""

Seconds = Annotated[float, Field(gt=0)]
Port = Annotated[int, Field(ge=0, le=65535)]  # 0 = any free port (tests)


class Section(BaseModel):
    """Base of every section: immutable, unknown keys rejected, defaults validated too
    (so default paths and URLs are normalized like configured ones)."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)
