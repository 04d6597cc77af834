"""Raw object keys (PROTOCOL §3, §3.10): frame blobs and bundles, both named by the
SHA-256 of their bytes. Public as `protocol.keys.*`.

A record's raw key is one of the two forms; `parse_raw_object_key` tells which, so every
join "by raw object key" (§3.10) goes through one parser.
"""

from __future__ import annotations

import re
from typing import Literal

from protocol._identity_keys import KeyFormatError, check_sha256

RAW_BLOBS_PREFIX = "raw-blobs/v1/sha256/"
RAW_BUNDLES_PREFIX = "raw-bundles/v1/sha256/"
RAW_BLOB_SUFFIX = ".lmbatch"
RAW_BUNDLE_SUFFIX = ".lmbundle"
RawKind = Literal["blob", "bundle"]

_RAW_RE = re.compile(
    r"raw-(blobs|bundles)/v1/sha256/([0-9a-f]{2})/([0-9a-f]{2})/([0-9a-f]{64})\.(lmbatch|lmbundle)"
)
_SUFFIX = {"blobs": RAW_BLOB_SUFFIX[1:], "bundles": RAW_BUNDLE_SUFFIX[1:]}


def raw_blob_key(sha: str) -> str:
    """The frame blob of a frame whose SHA-256 is `sha`."""
    return f"{RAW_BLOBS_PREFIX}{sha[0:2]}/{sha[2:4]}/{check_sha256(sha)}{RAW_BLOB_SUFFIX}"


def raw_bundle_key(sha: str) -> str:
    """The bundle whose bytes hash to `sha` (§3.10)."""
    return f"{RAW_BUNDLES_PREFIX}{sha[0:2]}/{sha[2:4]}/{check_sha256(sha)}{RAW_BUNDLE_SUFFIX}"


def parse_raw_object_key(key: str) -> tuple[RawKind, str]:
    """(``"blob"`` or ``"bundle"``, the sha256) of a canonical raw object key."""
    match = _RAW_RE.fullmatch(key)
    if (
        not match
        or match.group(4)[:4] != match.group(2) + match.group(3)
        or _SUFFIX[match.group(1)] != match.group(5)
    ):
        raise KeyFormatError(f"not a raw object key: {key!r}")
    return ("blob" if match.group(1) == "blobs" else "bundle"), match.group(4)


def _parse_kind(key: str, kind: RawKind, what: str) -> str:
    try:
        found, sha = parse_raw_object_key(key)
    except KeyFormatError:
        found, sha = None, ""
    if found != kind:
        raise KeyFormatError(f"not a {what} key: {key!r}")
    return sha


def parse_raw_blob_key(key: str) -> str:
    """Return the sha256 named by a raw-blob (frame blob) key."""
    return _parse_kind(key, "blob", "raw-blob")


def parse_raw_bundle_key(key: str) -> str:
    """Return the sha256 named by a bundle key."""
    return _parse_kind(key, "bundle", "raw-bundle")
