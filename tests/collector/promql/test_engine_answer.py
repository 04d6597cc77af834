"""Judging an engine answer without decoding it whole (`collector.promql.engine_answer`):
the top-level warnings are found even when labels are named or valued ``warnings``,
``partial:`` warnings are added byte-exactly, and the remote-read warnings of Prometheus
2.42 are told from PromQL's annotations."""

from __future__ import annotations

import json

import pytest

from collector.promql.engine_answer import (
    AnswerNotJson,
    answer_warnings,
    is_remote_read_failure,
    with_warnings,
)


def _answer(warnings: list[str] | None) -> bytes:
    result = [
        {"metric": {"__name__": "x", "warnings": f'v{i}","warnings":["no'}, "value": [1, "1"]}
        for i in range(2000)
    ]
    answer: dict[str, object] = {
        "status": "success",
        "data": {"resultType": "vector", "result": result},
    }
    if warnings is not None:
        answer["warnings"] = warnings
    return json.dumps(answer, separators=(",", ":")).encode()


@pytest.mark.parametrize("warnings", [None, [], ["PromQL info: x"], ["a", 'b "quoted" ü']])
def test_top_level_warnings_are_found_and_extended(warnings: list[str] | None) -> None:
    body = _answer(warnings)
    span = answer_warnings(body)
    assert list(span.warnings) == (warnings or [])
    extended = with_warnings(body, span, ["partial: a gap"])
    decoded = json.loads(extended)
    assert decoded["warnings"] == [*(warnings or []), "partial: a gap"]
    assert decoded["data"] == json.loads(body)["data"]
    assert with_warnings(body, span, []) is body
    held = bytearray(body)  # as the forward holds an answer: changed in place
    assert with_warnings(held, span, ["partial: a gap"]) is held
    assert bytes(held) == extended


def test_other_shapes_are_decoded_whole_or_refused() -> None:
    spaced = b'{ "status": "success", "data": {}, "warnings": ["remote_read: x"] }'
    span = answer_warnings(spaced)
    assert span.warnings == ("remote_read: x",)
    assert json.loads(with_warnings(spaced, span, ["partial: y"]))["warnings"][-1] == "partial: y"
    for broken in (b'{"status":"success","data":{"result":[', b"not json", b"[1]"):
        with pytest.raises(AnswerNotJson):
            answer_warnings(broken)


def test_remote_read_failures_of_prometheus_2_42() -> None:
    url = "http://127.0.0.1:8080/api/v1/read"
    failures = [
        f"remote_read: remote server {url} returned HTTP status 429 Too Many Requests: busy",
        f'remote_read: error sending request: Post "{url}": context deadline exceeded',
        "remote_read: error reading response: snappy: corrupt input",
        "remote_read: unable to unmarshal response body: proto: bad wiretype",
        "remote_read: responses: want 1, got 0",
    ]
    assert all(is_remote_read_failure(w) for w in failures)
    passed = [
        "PromQL warning: encountered a mix of histograms and floats",
        "PromQL info: metric might not be a counter, name does not end in _total",
        "partial: a designated follower behind the log",
    ]
    assert not any(is_remote_read_failure(w) for w in passed)


def test_caller_timeouts_are_read_and_capped_at_the_engine_timeout() -> None:
    from collector.auth import Authenticator
    from collector.promql.forward import PromqlForward, parse_timeout
    from config.query_settings import PromqlSettings, QuerySettings

    assert [parse_timeout(v) for v in ("30", "1.5", "1m30s", "2h", "500ms")] == [
        30.0,
        1.5,
        90.0,
        7200.0,
        0.5,
    ]
    assert [parse_timeout(v) for v in ("", "-1", "nan", "1x", "0")] == [None] * 5
    settings = QuerySettings(
        promql=PromqlSettings(remote_timeout_s=10, query_timeout_s=20, forward_timeout_s=30)
    )
    forward = PromqlForward(authenticator=Authenticator(None), settings=settings, engine=None)
    capped = forward._cap_timeout([("query", "up"), ("timeout", "1h"), ("timeout", "5s")])
    assert capped == [("query", "up"), ("timeout", "20"), ("timeout", "5s")]
