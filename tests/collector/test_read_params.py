"""Parameters of the read endpoints (issue 24 items 14 and 15, PROTOCOL §2).

``/v1/query`` times are unix seconds (fraction allowed) or RFC 3339, and a bare number
≥ 10^11 is refused naming the unit; whatever the query string holds — Unicode digits, a
lone surrogate, a date beyond Python's range, 5000 digits — the answer is 400 naming the
parameter, never a 500. ``/v1/conflicts`` likewise, over real HTTP with aiohttp's
pure-Python request parser, which hands raw non-ASCII bytes to the handler as lone
surrogates."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import date
from typing import Any

import pytest
from aiohttp import http_parser
from aiohttp.test_utils import make_mocked_request

from collector.auth import Authenticator
from collector.conflicts_api import ConflictQuery, conflict_filters
from collector.metrics import CollectorMetrics
from collector.query.api import LiveQuery, QueryError, parse_query
from collector.query.committed import SnapshotSource
from collector.query.coverage import Coverage
from collector.query.endpoint import QueryEndpoint
from config import Principal, TokenTable, hash_token
from config.settings import QuerySettings
from protocol import keys
from store.memory import MemoryStore
from tests.collector.conftest import BOOT
from tests.collector.inprocess import ADMIN_TOKEN, in_process_collector

NS = 1_000_000_000
NOW_NS = keys.UtcHour(date(2026, 11, 21), 10).start_ns
PROMETHEUS_STYLE = 1795755366  # 2026-11-28T...: seconds, as Grafana/Prometheus send them


def q(**params: str) -> LiveQuery:
    return parse_query({"metric": ["cpu"], **{k: [v] for k, v in params.items()}}, now_ns=NOW_NS)


def refused(parse: Any, **params: str) -> dict[str, Any]:
    with pytest.raises(QueryError) as caught:
        parse(**params)
    assert caught.value.status == 400
    body = caught.value.body()
    json.dumps(body, ensure_ascii=False).encode("utf-8")  # sendable as UTF-8 JSON
    return body


def test_from_and_to_are_unix_seconds() -> None:
    parsed = q(**{"from": str(PROMETHEUS_STYLE), "to": f"{PROMETHEUS_STYLE + 60}.25"})
    assert parsed.from_ns == PROMETHEUS_STYLE * NS
    assert parsed.to_ns == (PROMETHEUS_STYLE + 60) * NS + 250_000_000
    # Nanoseconds are the finest unit: more digits are floored.
    assert q(to="1.0000000019").to_ns == NS + 1
    assert q(**{"from": "0", "to": "0.5"}).from_ns == 0
    rfc = q(**{"from": "2026-11-21T10:00:00Z", "to": "2026-11-21T11:30:00+01:00"})
    assert (rfc.from_ns, rfc.to_ns) == (NOW_NS, NOW_NS + 1800 * NS)
    assert q(to="2026-11-21T10:00:00").to_ns == NOW_NS  # no offset: UTC
    as_of = q(as_of=str(PROMETHEUS_STYLE)).as_of
    assert as_of is not None and int(as_of.timestamp()) == PROMETHEUS_STYLE


@pytest.mark.parametrize(
    "value",
    [
        str(PROMETHEUS_STYLE * 1000),  # milliseconds
        str(PROMETHEUS_STYLE * NS),  # nanoseconds, what the old API took
        "100000000000",  # 10^11 exactly
        "100000000000.5",
        "9" * 5000,  # past int()'s digit limit
    ],
)
def test_a_bare_number_too_large_for_seconds_is_refused_naming_the_unit(value: str) -> None:
    for param in ("from", "to", "as_of"):
        body = refused(q, **{param: value})
        assert body["error"] == "invalid_query" and body["param"] == param
        assert "unix seconds" in body["detail"] and "10^11" in body["detail"]


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"from": "²"}, "from"),  # str.isdigit() is True, int() raises
        ({"to": "١٢٣"}, "to"),  # Arabic-Indic digits: not read as 123
        ({"to": "1e9"}, "to"),
        ({"to": "-5"}, "to"),
        ({"to": "0x10"}, "to"),
        ({"to": "10000000000"}, "to"),  # seconds, but past int64 nanoseconds (2262)
        ({"to": "2300-01-01T00:00:00Z"}, "to"),
        ({"from": "1969-12-31T23:59:59Z"}, "from"),
        ({"as_of": "0001-01-01T00:00:00+01:00"}, "as_of"),  # OverflowError
        ({"as_of": "9999-12-31T23:59:59-23:59"}, "as_of"),
        ({"from": "\ud800"}, "from"),
        ({"version": "²"}, "version"),
        ({"version": "9" * 30}, "version"),
        ({"version": "٣"}, "version"),
        ({"agent": "a\udcff"}, "agent"),
        ({"label": "host=\ud800"}, "label"),
        ({"\ud800x": "1"}, "\\ud800x"),  # an unknown name, shown without the surrogate
    ],
)
def test_query_parameters_never_raise_anything_but_a_400(
    params: dict[str, str], param: str
) -> None:
    body = refused(q, **params)
    assert (body["error"], body["param"]) == ("invalid_query", param), body


async def test_the_endpoint_answers_400_not_500() -> None:
    token = "read-params"
    endpoint = QueryEndpoint(
        authenticator=Authenticator(
            TokenTable([Principal(name="r", token_sha256=hash_token(token), read=True)])
        ),
        settings=QuerySettings(),
        snapshots=SnapshotSource(MemoryStore(), refresh_interval_s=60, max_travel_versions=10),
        coverage=Coverage(MemoryStore(), settle_margin_s=5, refresh_interval_s=60),
        filesystem=lambda: (_ for _ in ()).throw(AssertionError("nothing is read")),
        metrics=CollectorMetrics(),
        now_ns=lambda: NOW_NS,
    )
    for query in ("from=%C2%B2", "version=%C2%B2", f"from={PROMETHEUS_STYLE * NS}"):
        request = make_mocked_request(
            "GET", f"/v1/query?metric=cpu&{query}", headers={"Authorization": f"Bearer {token}"}
        )
        response = await endpoint.get_query(request)
        assert response.status == 400, query
        assert response.body is not None
        assert json.loads(response.body)["param"] in ("from", "version")


# --- /v1/conflicts ----------------------------------------------------------------------


def filters(**params: str) -> ConflictQuery:
    return conflict_filters({k: [v] for k, v in params.items()})


def test_conflict_filters() -> None:
    assert filters() == (None, None, 1000, None)
    after = keys.quarantine_key(keys.BatchIdentity("agent-a", BOOT, 1, 2), "a" * 64)
    assert filters(agent_id="agent-a", since="1795755366000000000", limit="5", after=after) == (
        "agent-a",
        1795755366 * NS,
        5,
        after,
    )
    assert filters(since="2026-11-21T10:00:00Z")[1] == NOW_NS
    assert filters(since="2999-01-01T00:00:00Z")[1] == 32472144000 * NS  # matches nothing
    assert filters(since="1900-01-01T00:00:00+01:00")[1] == -2208992400 * NS  # everything
    assert filters(agent_id="\ufffd\ufffd\ufffd")[0] == "\ufffd\ufffd\ufffd"  # valid UTF-8


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"agent_id": "\ud800"}, "agent_id"),
        ({"agent_id": "a\udced\udca0\udc80"}, "agent_id"),
        ({"agent_id": "a\x00"}, "agent_id"),
        ({"agent_id": "a" * 129}, "agent_id"),
        ({"agent_id": ""}, "agent_id"),
        ({"since": "²"}, "since"),
        ({"since": "\udcff"}, "since"),
        ({"since": "9" * 5000}, "since"),
        ({"since": "2026-11-21T10:00:00"}, "since"),  # no timezone
        ({"since": "9999-12-31T23:59:59-23:59"}, "since"),
        ({"since": str(2**63)}, "since"),
        ({"limit": "²"}, "limit"),
        ({"limit": "0"}, "limit"),
        ({"after": "quarantine/v1/identity-conflict/"}, "after"),
        ({"after": "\udcff"}, "after"),
        ({"after": "9" * 5000}, "after"),
        (
            {
                "agent_id": "agent-b",
                "after": keys.quarantine_key(keys.BatchIdentity("agent-a", BOOT, 1, 2), "a" * 64),
            },
            "after",
        ),
        ({"agent": "a"}, "agent"),  # a typo must not list every agent's conflicts
    ],
)
def test_conflict_filters_refuse_naming_the_parameter(params: dict[str, str], param: str) -> None:
    body = refused(filters, **params)
    assert (body["error"], body["param"]) == ("invalid_query", param), body


@pytest.fixture
def python_http_parser(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """aiohttp's pure-Python parser (no C extension: ``AIOHTTP_NO_EXTENSIONS``, PyPy): it
    passes raw non-ASCII bytes of a query string on as lone surrogates."""
    monkeypatch.setattr("aiohttp.web_protocol.HttpRequestParser", http_parser.HttpRequestParserPy)
    yield


async def raw_get(port: int, target: bytes) -> tuple[int, dict[str, Any]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + ADMIN_TOKEN.encode() + b"\r\nConnection: close\r\n\r\n"
        )  # fmt: skip
        await writer.drain()
        head, _, body = (await asyncio.wait_for(reader.read(), 10)).partition(b"\r\n\r\n")
    finally:
        writer.close()
    return int(head.split(b" ")[1]), json.loads(body)


async def test_conflicts_with_a_lone_surrogate_is_400_naming_agent_id(
    python_http_parser: None,
) -> None:
    async with in_process_collector() as collector:
        for target, param in (
            (b"/v1/conflicts?agent_id=\xed\xa0\x80", "agent_id"),
            (b"/v1/conflicts?agent_id=agent-\xff", "agent_id"),
            (b"/v1/conflicts?since=\xff", "since"),
            (b"/v1/conflicts?limit=%C2%B2", "limit"),
            (b"/v1/conflicts?after=quarantine/v1/identity-conflict/\xff", "after"),
        ):
            status, body = await raw_get(collector.port, target)
            assert (status, body.get("error"), body.get("param")) == (
                400,
                "invalid_query",
                param,
            ), (target, body)
        # Percent-encoded bytes that are not UTF-8 decode to U+FFFD (yarl): a valid
        # agent_id that simply has no conflicts.
        status, body = await raw_get(collector.port, b"/v1/conflicts?agent_id=%ED%A0%80")
        assert (status, body) == (200, {"conflicts": [], "next": None, "truncated": False})
