"""Fault decisions (pure): a function of seed, phase, operation, key and occurrence;
409s only for conditional writes; rules by operation and key prefix; latencies bounded;
S3 requests classified by method, conditional headers and query."""

from __future__ import annotations

import random

import pytest
from multidict import CIMultiDict
from yarl import URL

from chaos.faults import CALM, FaultKind, FaultRule, Latency, Phase, classify, decide

K = FaultKind
CREATES = frozenset({"put_if_none_match"})


def test_decisions_are_a_function_of_seed_phase_op_key_and_occurrence() -> None:
    phase = Phase(
        "p",
        (
            FaultRule(
                {K.SLOWDOWN_503: 0.3, K.LOST_ANSWER: 0.3}, latency=Latency("exponential", 0.01)
            ),
        ),
    )
    first = [
        decide(5, phase, "put_if_none_match", f"k/{i}", n) for i in range(50) for n in range(3)
    ]
    again = [
        decide(5, phase, "put_if_none_match", f"k/{i}", n) for i in range(50) for n in range(3)
    ]
    other = [
        decide(6, phase, "put_if_none_match", f"k/{i}", n) for i in range(50) for n in range(3)
    ]
    assert first == again
    assert first != other
    kinds = {d.kind for d in first}
    assert {K.SLOWDOWN_503, K.LOST_ANSWER, None} <= kinds


def test_conflicts_only_for_conditional_puts_and_outage_for_everything() -> None:
    phase = Phase("c", (FaultRule({K.CONFLICT_409: 1.0}),))
    for op in ("get", "head", "list", "put", "delete"):
        assert decide(1, phase, op, "k", 0).kind is None
    for op in ("put_if_none_match", "put_if_match"):
        assert decide(1, phase, op, "k", 0).kind is K.CONFLICT_409
    down = Phase("down", outage=True)
    assert decide(1, down, "get", "k", 0).kind is K.OUTAGE


def test_first_matching_rule_decides_by_operation_and_prefix() -> None:
    phase = Phase(
        "r",
        (
            FaultRule({K.ERROR_500: 1.0}, ops=CREATES, prefix="accepted/"),
            FaultRule({K.SLOWDOWN_503: 1.0}),
        ),
    )
    assert decide(1, phase, "put_if_none_match", "accepted/v1/x", 0).kind is K.ERROR_500
    assert decide(1, phase, "put_if_none_match", "raw-blobs/v1/x", 0).kind is K.SLOWDOWN_503
    assert decide(1, phase, "get", "accepted/v1/x", 0).kind is K.SLOWDOWN_503
    assert decide(1, CALM, "get", "accepted/v1/x", 0).kind is None


def test_rules_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="add up"):
        FaultRule({K.ERROR_500: 0.7, K.RESET: 0.7})
    with pytest.raises(ValueError, match="unknown operations"):
        FaultRule({}, ops=frozenset({"patch"}))
    with pytest.raises(ValueError, match="rated"):
        FaultRule({K.OUTAGE: 0.1})


def test_latency_distributions_stay_within_their_cap() -> None:
    rng = random.Random(3)
    for latency in (
        Latency("fixed", 0.2),
        Latency("uniform", 0.1, 0.3),
        Latency("exponential", 0.5, cap_s=1.0),
        Latency("lognormal", 0.05, 2.0, cap_s=0.4),
    ):
        samples = [latency.sample(rng) for _ in range(500)]
        assert all(0.0 <= s <= latency.cap_s for s in samples)
    assert all(Latency("fixed", 0.2, rate=0.0).sample(rng) == 0.0 for _ in range(20))


@pytest.mark.parametrize(
    ("method", "url", "headers", "expected"),
    [
        ("GET", "/b/p/accepted/v1/x.json", {}, ("get", "accepted/v1/x.json")),
        ("HEAD", "/b/p/raw-blobs/v1/a", {}, ("head", "raw-blobs/v1/a")),
        ("PUT", "/b/p/k", {"If-None-Match": "*"}, ("put_if_none_match", "k")),
        ("PUT", "/b/p/k", {"If-Match": '"e"'}, ("put_if_match", "k")),
        ("PUT", "/b/p/k", {}, ("put", "k")),
        ("DELETE", "/b/p/gc/v1/marks/x", {}, ("delete", "gc/v1/marks/x")),
        ("GET", "/b?list-type=2&prefix=p%2Faccepted%2F", {}, ("list", "accepted/")),
        ("POST", "/b/p/k?uploads", {}, ("post", "k")),
    ],
)
def test_classify(
    method: str, url: str, headers: dict[str, str], expected: tuple[str, str]
) -> None:
    assert classify(method, URL(url), CIMultiDict(headers), "b/p/") == expected
