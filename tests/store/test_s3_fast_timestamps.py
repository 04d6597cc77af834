"""The fast timestamp parser reads what botocore's parser reads, the same way."""

from __future__ import annotations

import pytest
from botocore.session import get_session
from botocore.utils import parse_timestamp

from store.s3_fast_parse import parse_s3_timestamp, use_fast_timestamps

FORMS = [
    "2026-11-23T22:55:34.000Z",  # ListObjectsV2 XML
    "2026-11-23T22:55:34Z",
    "2026-11-23T22:55:34.123456+01:00",
    "Mon, 23 Nov 2026 22:55:34 GMT",  # Last-Modified header
    "1763938534",  # epoch seconds, handed to botocore
    1763938534,
]


@pytest.mark.parametrize("value", FORMS)
def test_every_form_parses_to_the_same_instant_as_botocore(value: object) -> None:
    ours = parse_s3_timestamp(value)
    assert ours.tzinfo is not None
    assert ours == parse_timestamp(value)


def test_a_session_configured_once_gives_its_clients_the_fast_parser() -> None:
    session = get_session()
    use_fast_timestamps(session)
    factory = session.get_component("response_parser_factory")
    parser = factory.create_parser("rest-xml")
    assert parser._timestamp_parser is parse_s3_timestamp
