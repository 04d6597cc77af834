"""Prometheus matchers on presented names (`collector.promql.matchers`): the four types,
``""`` for an absent label, RE2 anchoring and semantics, refusals that name the
pattern or the limit, and linear time on a pathological pattern."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

from collector.promql.matchers import (
    MAX_MATCHERS,
    MatcherError,
    all_match_empty,
    check_not_all_empty,
    compile_matcher,
    compile_matchers,
    select_label_sets,
)
from collector.promql.selector import Matcher


def test_the_four_types_and_absent_labels() -> None:
    values = pa.array(["a", "b", None, "ab", ""])
    expected = {
        ("EQ", "a"): [True, False, False, False, False],
        ("NEQ", "a"): [False, True, True, True, True],
        ("RE", "a.*"): [True, False, False, True, False],
        ("NRE", "a.*"): [False, True, True, False, True],
        ("EQ", ""): [False, False, True, False, True],  # absent is ""
        ("RE", "b|"): [False, True, True, False, True],
    }
    for (kind, value), want in expected.items():
        matcher = compile_matcher(kind, "host", value)
        assert matcher.mask(values).tolist() == want, (kind, value)
        assert [matcher.matches(v or "") for v in values.to_pylist()] == want
    # Type numbers as in prometheus.LabelMatcher.Type.
    assert [compile_matcher(n, "x", "y").kind for n in range(4)] == ["EQ", "NEQ", "RE", "NRE"]


def test_regexes_are_anchored_and_dot_does_not_match_newline() -> None:
    assert not compile_matcher("RE", "l", "b").matches("abc")  # ^(?:b)$, not a search
    assert compile_matcher("RE", "l", "a|b").matches("b")  # the group keeps | inside
    assert not compile_matcher("RE", "l", "a.b").matches("a\nb")  # Prometheus 2.x
    assert compile_matcher("RE", "l", "(?s)a.b").matches("a\nb")  # when asked for
    assert compile_matcher("RE", "l", "é.").matches("éü")  # code points, not bytes


@pytest.mark.parametrize("pattern", ["(", "(?<=a)b", "a{1001}", "\\8", "[z-a]"])
def test_a_pattern_re2_refuses_is_named(pattern: str) -> None:
    with pytest.raises(MatcherError, match="invalid regex") as caught:
        compile_matcher("RE", "l", pattern)
    assert repr(pattern)[1:-1][:10] in str(caught.value)


def test_limits_are_named() -> None:
    many = [Matcher("NEQ", f"l{i}", "x") for i in range(10_000)]
    started = time.perf_counter()
    with pytest.raises(MatcherError, match="MAX_MATCHERS") as caught:
        compile_matchers(many)
    assert caught.value.limit == "MAX_MATCHERS" and time.perf_counter() - started < 1.0
    assert len(compile_matchers(many[:MAX_MATCHERS])) == MAX_MATCHERS
    with pytest.raises(MatcherError, match="MAX_PATTERN_BYTES"):
        compile_matcher("RE", "l", "a" * 70_000)


def _best_of(runs: int, work: object) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        work()  # type: ignore[operator]
        best = min(best, time.perf_counter() - started)
    return best


def test_pathological_patterns_run_in_linear_time() -> None:
    """``(a+)+$`` against "a" * n + "b" takes a backtracking engine 2^n steps (n = 30 is
    minutes); RE2 is linear: 100 kB costs about 10x 10 kB (a ratio: no wall-clock bound,
    which a loaded machine breaks)."""
    for pattern in ("(a+)+$", "(a|aa)+$", "(a*)*b$"):
        matcher = compile_matcher("RE", "l", pattern)
        small = pa.array(["a" * 10_000 + "c"])
        large = pa.array(["a" * 100_000 + "c"])
        t_small = _best_of(5, lambda m=matcher, v=small: m.mask(v))
        t_large = _best_of(5, lambda m=matcher, v=large: m.mask(v))
        # Linear: 10x the input costs about 10x (a generous 40x bound for timer noise).
        assert t_large < 40 * max(t_small, 20e-6), (pattern, t_small, t_large)
        assert not matcher.matches("a" * 100_000 + "c")
        assert compile_matcher("RE", "l", pattern).matches(
            "a" * 100_000 + ("b" if "b" in pattern else "")
        )


def test_empty_matching_selectors() -> None:
    empty = compile_matchers(
        [Matcher("EQ", "a", ""), Matcher("NEQ", "b", "x"), Matcher("RE", "c", ".*")]
    )
    assert all_match_empty(empty) and all_match_empty(())
    with pytest.raises(MatcherError, match="non-empty matcher"):
        check_not_all_empty(empty)
    check_not_all_empty((*empty, compile_matcher("RE", "c", ".+")))


def test_select_label_sets_per_series() -> None:
    names = pa.array(["cpu", "cpu", "mem"])
    labels = pa.array(
        [[("host", "a")], [("host", "b"), ("zone", "x")], []], pa.map_(pa.string(), pa.string())
    )
    cases = {
        (("EQ", "__name__", "cpu"),): [True, True, False],
        (("EQ", "__name__", "cpu"), ("NEQ", "host", "a")): [False, True, False],
        (("RE", "zone", ".*"),): [True, True, True],
        (("EQ", "zone", ""), ("RE", "__name__", "c.u|mem")): [True, False, True],
        (("NRE", "host", "a|b"),): [False, False, True],
    }
    for specs, want in cases.items():
        matchers = compile_matchers([Matcher(*spec) for spec in specs])
        assert select_label_sets(names, labels, matchers).tolist() == want, specs
