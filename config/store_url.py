"""The ``[store] url``: where the acceptance authority lives.

``file://PATH`` (the embedded filesystem store; a relative PATH is resolved against the
working directory at load), ``memory://[NAME]`` (in-process, for tests) or
``s3://BUCKET[/PREFIX]``. `parse_store_url` is pure apart from that one resolution.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# S3 bucket naming rules (general purpose buckets): 3-63 chars, lowercase letters,
# digits, dots and hyphens, starting and ending with a letter or digit.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True, slots=True)
class FileLocation:
    """Object ``K`` is the file ``path / K``; ``path`` is absolute."""

    path: Path

    @property
    def url(self) -> str:
        return f"file://{self.path}"


@dataclass(frozen=True, slots=True)
class MemoryLocation:
    """An in-process store; ``name`` tells several apart (may be empty)."""

    name: str

    @property
    def url(self) -> str:
        return f"memory://{self.name}"


@dataclass(frozen=True, slots=True)
class S3Location:
    """Every key lives under ``prefix`` (no leading or trailing slash; ``""`` for the
    bucket root) in ``bucket``: object ``K`` is ``f"{prefix}/{K}"`` or ``K``."""

    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


StoreLocation = FileLocation | MemoryLocation | S3Location


def parse_store_url(url: str) -> StoreLocation:
    """Parse and normalize a store URL. Raises `ValueError` saying what is wrong."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("file", "memory", "s3"):
        raise ValueError("must start with file://, memory:// or s3://")
    if scheme == "file":
        if not rest:
            raise ValueError("file:// needs a directory, e.g. file:///var/lib/lightmetrics")
        return FileLocation(path=Path(os.path.abspath(rest)))
    if scheme == "memory":
        if "/" in rest:
            raise ValueError("memory:// takes a name without '/', e.g. memory://test")
        return MemoryLocation(name=rest)
    return _parse_s3(rest)


def _parse_s3(rest: str) -> S3Location:
    if "?" in rest or "#" in rest:
        raise ValueError("s3:// URLs take no query string or fragment")
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise ValueError(
            f"bucket name {bucket!r} is invalid: 3-63 lowercase letters, digits, "
            "'.' or '-', starting and ending with a letter or digit"
        )
    prefix = prefix.strip("/")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise ValueError(f"prefix {prefix!r} has an empty, '.' or '..' segment")
    return S3Location(bucket=bucket, prefix=prefix)
