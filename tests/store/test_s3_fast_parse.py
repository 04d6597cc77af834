"""The fast ListObjectsV2 parser reads what botocore's parser reads, the same way."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.session import get_session

from store.s3_fast_parse import (
    _before_parse,
    _checked_before_parse,
    parse_contents,
    use_fast_listings,
)


def entry(key: str, etag: str, size: int, modified: str, extra: str = "") -> str:
    return (
        f"<Contents><Key>{key}</Key><LastModified>{modified}</LastModified>"
        f"<ETag>{etag}</ETag>{extra}<Size>{size}</Size><StorageClass>STANDARD</StorageClass>"
        "<Owner><ID>x</ID><DisplayName>y</DisplayName></Owner></Contents>"
    )


def page(*entries: str, truncated: bool = True) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
        f"<Name>b</Name><Prefix>p/</Prefix><KeyCount>{len(entries)}</KeyCount>"
        f"<MaxKeys>1000</MaxKeys><IsTruncated>{'true' if truncated else 'false'}</IsTruncated>"
        + "".join(entries)
        + "<CommonPrefixes><Prefix>p/d/</Prefix></CommonPrefixes>"
        "<NextContinuationToken>tok</NextContinuationToken></ListBucketResult>"
    ).encode()


def botocore_parse(body: bytes, *, fast: bool) -> dict[str, Any]:
    session = get_session()
    model = session.get_service_model("s3").operation_model("ListObjectsV2")
    response = {"status_code": 200, "headers": {}, "body": body}
    custom: dict[str, Any] = {}
    if fast:
        _before_parse(response_dict=response, customized_response_dict=custom)
    parsed = session.get_component("response_parser_factory").create_parser("rest-xml")
    answer: dict[str, Any] = parsed.parse(response, model.output_shape)
    answer.update(custom)
    answer.pop("ResponseMetadata", None)
    return answer


BODY = page(
    entry("p/a", '&quot;0cc175b9c0f1b6a831c399e269772661&quot;', 1, "2026-11-23T22:55:34.000Z"),
    entry("p/&amp;&lt;b&gt;&apos; é😀", '"x-2"', 12345678901, "2026-11-23T22:55:34.123Z",
          extra="<ChecksumAlgorithm>CRC32</ChecksumAlgorithm>"),
)  # fmt: skip


# The entries as one block (cut out at once), and spread out (substituted one by one).
SPREAD = BODY.replace(b"</Contents><Contents>", b"</Contents>\n  <Contents>")


@pytest.mark.parametrize("body", [BODY, SPREAD], ids=["block", "spread"])
def test_the_fast_parse_equals_botocore_on_the_fields_the_store_reads(body: bytes) -> None:
    slow, fast = botocore_parse(body, fast=False), botocore_parse(body, fast=True)
    fields = ("Key", "ETag", "Size", "LastModified")
    assert [{f: e[f] for f in fields} for e in slow["Contents"]] == fast["Contents"]
    assert fast["Contents"][1]["Key"] == "p/&<b>' é😀"
    for name in ("IsTruncated", "CommonPrefixes", "NextContinuationToken", "KeyCount"):
        assert fast[name] == slow[name]


@pytest.mark.parametrize(
    "body",
    [
        page(entry("p/&#13;x", '"e"', 1, "2026-11-23T22:55:34.000Z")),  # a character reference
        page(entry("p/<![CDATA[x]]>", '"e"', 1, "2026-11-23T22:55:34.000Z")),
        page("<Contents><Key>p/a</Key><Size>1</Size></Contents>"),  # fields missing
    ],
)
def test_anything_unusual_is_left_to_botocore(body: bytes) -> None:
    assert parse_contents(body) is None
    response = {"status_code": 200, "headers": {}, "body": body}
    custom: dict[str, Any] = {}
    _before_parse(response_dict=response, customized_response_dict=custom)
    assert custom == {} and response["body"] == body


def test_an_error_answer_is_left_to_botocore() -> None:
    response = {"status_code": 500, "headers": {}, "body": BODY}
    custom: dict[str, Any] = {}
    _before_parse(response_dict=response, customized_response_dict=custom)
    assert custom == {} and response["body"] == BODY


def test_a_body_cut_off_between_entries_is_still_an_error_botocore_retries() -> None:
    model = get_session().get_service_model("s3").operation_model("ListObjectsV2")
    cut = BODY[: BODY.index(b"<CommonPrefixes>")]  # after the last whole entry
    response = {"status_code": 200, "headers": {}, "body": cut}
    custom: dict[str, Any] = {}
    _checked_before_parse(model, response, custom)
    assert response == {"status_code": 500, "headers": {}, "body": cut} and custom == {}
    whole = {"status_code": 200, "headers": {}, "body": BODY}
    _checked_before_parse(model, whole, custom)
    assert whole["status_code"] == 200 and len(custom["Contents"]) == 2


def test_a_client_checks_200_answers_once_after_the_fast_parse() -> None:
    client = get_session().create_client("s3", region_name="us-east-1")
    use_fast_listings(client)
    called: list[str] = []
    client.meta.events.register("before-parse.s3.*", lambda **_: called.append("later"))
    model = client.meta.service_model.operation_model("ListObjectsV2")
    response = {"status_code": 200, "headers": {}, "body": BODY[: BODY.index(b"<Common")]}
    custom: dict[str, Any] = {}
    client.meta.events.emit(
        "before-parse.s3.ListObjectsV2",
        operation_model=model,
        response_dict=response,
        customized_response_dict=custom,
    )
    assert response["status_code"] == 500 and called == ["later"]  # checked, and once
