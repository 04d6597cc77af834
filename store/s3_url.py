"""``s3://bucket/prefix`` store URLs: split, with the bucket checked against S3's naming
rules and the prefix against the key rules (`StoreConfigError` names the problem)."""

from __future__ import annotations

import ipaddress
import re

from store.base import check_key
from store.errors import StoreConfigError

_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_BUCKET_BAD_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_BAD_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def check_bucket_name(bucket: str) -> None:
    """Raise `StoreConfigError` unless ``bucket`` follows S3's general-purpose naming rules."""
    problem = None
    if not 3 <= len(bucket) <= 63:
        problem = "must be 3-63 characters long"
    elif not _BUCKET_RE.fullmatch(bucket):
        problem = "only lowercase letters, digits, '.' and '-', starting and ending alphanumeric"
    elif ".." in bucket or ".-" in bucket or "-." in bucket:
        problem = "no '..', '.-' or '-.'"
    elif bucket.startswith(_BUCKET_BAD_PREFIXES) or bucket.endswith(_BUCKET_BAD_SUFFIXES):
        problem = "uses a prefix or suffix S3 reserves"
    elif _is_ip_address(bucket):
        problem = "must not look like an IP address"
    if problem is not None:
        raise StoreConfigError(f"invalid S3 bucket name {bucket!r}: {problem}")


def parse_s3_url(url: str) -> tuple[str, str]:
    """Split ``s3://bucket[/prefix]`` into ``(bucket, prefix)``; prefix without slashes
    at either end (``""`` for the whole bucket). `StoreConfigError` names the problem."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != "s3":
        raise StoreConfigError(f"store URL {url!r}: expected s3://bucket/prefix")
    if "?" in rest or "#" in rest:
        raise StoreConfigError(f"store URL {url!r}: no query or fragment allowed")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise StoreConfigError(f"store URL {url!r}: no bucket name")
    check_bucket_name(bucket)
    return bucket, normalize_prefix(prefix, url=url)


def normalize_prefix(prefix: str, *, url: str | None = None) -> str:
    prefix = prefix.rstrip("/")
    if prefix:
        try:
            check_key("prefix", prefix)
        except ValueError as exc:
            where = f"store URL {url!r}" if url is not None else "S3 prefix"
            raise StoreConfigError(f"{where}: {exc}") from exc
    return prefix


def _is_ip_address(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True
