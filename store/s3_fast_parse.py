"""Fast parsers for botocore's answers: the ``<Contents>`` of ListObjectsV2 answers, and
every timestamp.

Listings. botocore parses a listing's XML into a tree and walks it against the service
model: about 50-75 µs of client CPU per key listed on this machine (profiled with
cProfile over a 20,000-key MiniStack listing, bench/RESULTS.md), most of a full audit's
listing CPU.
`parse_contents` reads the four fields `S3Store.list` uses (``Key``, ``LastModified``,
``ETag``, ``Size``) of every ``<Contents>`` element with one regular expression, and
`use_fast_listings` hooks it into a client's ``before-parse`` event: the entries it read
are removed from the body botocore parses (which still parses the rest: ``IsTruncated``,
``CommonPrefixes``, tokens, errors) and merged into its answer as ``Contents``.

Anything unexpected (not a 200, an element it cannot read, a CDATA section, a count that
does not add up) leaves the answer to botocore unchanged: never read differently, at
worst read slower.

Timestamps. botocore parses every timestamp of a response (each ``LastModified`` of a
listing, the ``Last-Modified`` header of a GET or HEAD) with dateutil: about 70 µs each on
this machine, most of a listing's client CPU (a 200,000-key audit spent ~14 s in it).
`parse_s3_timestamp` reads the two forms S3 sends with the standard library (ISO 8601 in
XML bodies, RFC 1123 in headers: well under 10 µs) and hands anything else to botocore's
own parser, so no response that botocore understood is read differently;
`use_fast_timestamps` makes a session's clients use it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from botocore import handlers as botohandlers
from botocore.utils import parse_timestamp

_CONTENTS = re.compile(rb"<Contents>(.*?)</Contents>", re.S)
_FIELD = re.compile(rb"<(Key|LastModified|ETag|Size)>([^<]*)</\1>")
_WANTED = {b"Key", b"LastModified", b"ETag", b"Size"}
_HANDLE_200_ERROR: Callable[..., None] | None = getattr(botohandlers, "_handle_200_error", None)
"""botocore's (private) before-parse check of S3's 200 answers, which `use_fast_listings`
replaces by `_checked_before_parse` (the same check, run after the entries are out)."""


def parse_contents(body: bytes) -> tuple[list[dict[str, Any]], bytes] | None:
    """(entries, body without them) or ``None`` when the body is not plainly readable."""
    if b"<![CDATA[" in body:
        return None
    entries: list[dict[str, Any]] = []
    for match in _CONTENTS.finditer(body):
        fields = dict(_FIELD.findall(match.group(1)))
        if fields.keys() != _WANTED:
            return None
        key, etag = _text(fields[b"Key"]), _text(fields[b"ETag"])
        if key is None or etag is None:
            return None
        entries.append(
            {
                "Key": key,
                "ETag": etag,
                "Size": int(fields[b"Size"]),
                "LastModified": _timestamp(fields[b"LastModified"]),
            }
        )
    if body.count(b"<Contents>") != len(entries):
        return None
    return entries, _without_contents(body)


def _without_contents(body: bytes) -> bytes:
    """``body`` without its ``<Contents>`` elements: one cut where they are one block (as
    S3 and MiniStack send them), else one substitution."""
    first, last = body.find(b"<Contents>"), body.rfind(b"</Contents>")
    if first < 0:
        return body
    end = last + len(b"</Contents>")
    block = body[first:end]
    if block.count(b"<Contents>") == block.count(b"</Contents><Contents>") + 1:
        return body[:first] + body[end:]
    return _CONTENTS.sub(b"", body)


def _text(raw: bytes) -> str | None:
    """XML character data with its five predefined entities; ``None`` for a character
    reference (``&#...;``: left to botocore's XML parser)."""
    text = raw.decode("utf-8")
    if "&" not in text:
        return text
    if "&#" in text:
        return None
    for entity, char in (("&lt;", "<"), ("&gt;", ">"), ("&quot;", '"'), ("&apos;", "'")):
        text = text.replace(entity, char)
    return text.replace("&amp;", "&")


def _timestamp(raw: bytes) -> datetime:
    return parse_s3_timestamp(raw.decode("ascii"))


def _before_parse(
    response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **_: Any
) -> None:
    body = response_dict.get("body")
    if response_dict.get("status_code") != 200 or not isinstance(body, bytes):
        return
    try:
        parsed = parse_contents(body)
    except (ValueError, UnicodeDecodeError):
        return  # botocore reads it (and says what is wrong, if anything)
    if parsed is None or not parsed[0]:
        return
    entries, rest = parsed
    response_dict["body"] = rest
    customized_response_dict["Contents"] = entries


def _checked_before_parse(
    operation_model: Any,
    response_dict: dict[str, Any],
    customized_response_dict: dict[str, Any],
    **kwargs: Any,
) -> None:
    """botocore's check of a 200 answer for an embedded error or a cut-off body (it
    parses the whole body into a tree), made after the entries were taken out, so it
    parses only the rest; a cut-off between entries still leaves the rest cut off. When
    the check turns the answer into an error, botocore reads the original body."""
    original = response_dict.get("body")
    if operation_model.name == "ListObjectsV2":
        _before_parse(response_dict, customized_response_dict)
    assert _HANDLE_200_ERROR is not None  # installed only with it (`use_fast_listings`)
    _HANDLE_200_ERROR(operation_model=operation_model, response_dict=response_dict, **kwargs)
    if response_dict.get("status_code") != 200:
        response_dict["body"] = original
        customized_response_dict.pop("Contents", None)


def use_fast_listings(client: Any) -> None:
    """Parse the ``<Contents>`` of ``client``'s ListObjectsV2 answers with `parse_contents`,
    before botocore's check of 200 answers (which then parses only the rest)."""
    if _HANDLE_200_ERROR is None:  # a botocore without it: leave its listings alone
        return
    events = client.meta.events
    events.unregister("before-parse.s3.*", _HANDLE_200_ERROR)
    events.register_first("before-parse.s3.*", _checked_before_parse)


def parse_s3_timestamp(value: Any) -> datetime:
    """A timezone-aware datetime for ``value``, as botocore's default parser returns."""
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)  # "2026-11-23T22:55:34.000Z"
        except ValueError:
            try:
                parsed = parsedate_to_datetime(value)  # "Mon, 23 Nov 2026 22:55:34 GMT"
            except (TypeError, ValueError, IndexError):
                return parse_timestamp(value)
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    return parse_timestamp(value)


def use_fast_timestamps(session: Any) -> None:
    """Make clients created from ``session`` (botocore or aiobotocore) parse timestamps
    with `parse_s3_timestamp`."""
    session.get_component("response_parser_factory").set_parser_defaults(
        timestamp_parser=parse_s3_timestamp
    )
