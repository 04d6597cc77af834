"""Names endpoints' parameters and matchers (PROTOCOL §5 "Names", "Matchers"): checked
before any work, refused with the parameter and the problem named."""

from __future__ import annotations

import pyarrow as pa
import pytest

from collector.params import QueryError
from collector.promql.matchers import check_not_all_empty, compile_matchers, select_label_sets
from collector.promql.names_params import NamesRequest, parse_names
from collector.promql.selector import SelectorError, parse_selector

S = 1_000_000_000
NOW = 1_800_000_000 * S
DAY_S = 86_400.0


def parse(**params: list[str]) -> NamesRequest:
    renamed = {("match[]" if key == "match" else key): value for key, value in params.items()}
    return parse_names(renamed, now_ns=NOW, default_range_s=DAY_S, max_range_s=366 * DAY_S)


def test_ranges_default_to_the_last_day_before_end() -> None:
    names = parse()
    assert (names.start_ns, names.end_ns) == (NOW - 86_400 * S, NOW)
    names = parse(end=["1700000000"])
    assert names.start_ns == 1_700_000_000 * S - 86_400 * S
    names = parse(start=["2027-01-14T08:00:00Z"])  # 1,800,000,000 s - 1 day
    assert (names.start_ns, names.end_ns) == (NOW - 86_400 * S, NOW)


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"start": ["10"], "end": ["5"]}, "before start"),
        ({"start": ["0"], "end": ["31708801"]}, "names_max_range_s"),
        ({"limit": ["-1"]}, "limit"),
        ({"match": ["up{"]}, "match[]"),
        ({"bogus": ["1"]}, "unknown parameter 'bogus'"),
        ({"start": ["1", "2"]}, "start given 2 times"),
        ({"end": ["soon"]}, "'end'"),
    ],
)
def test_bad_parameters_are_400_naming_them(params: dict[str, list[str]], words: str) -> None:
    with pytest.raises(QueryError) as caught:
        parse(**params)
    assert caught.value.status == 400
    assert words in caught.value.detail


SETS_NAMES = pa.array(["up", "up", "http_requests_total", "a_b"])
SETS_LABELS = pa.array(
    [[("job", "api")], [("job", "db"), ("env", "")], [("code", "200"), ("job", "api")], []],
    pa.map_(pa.string(), pa.string()),
)


def selector_mask(names: pa.Array, labels: pa.Array, selector: str) -> list[bool]:
    matchers = compile_matchers(parse_selector(selector))
    check_not_all_empty(matchers)
    return [bool(hit) for hit in select_label_sets(names, labels, matchers)]


def mask(selector: str) -> list[bool]:
    return selector_mask(SETS_NAMES, SETS_LABELS, selector)


def test_the_four_matchers_on_presented_label_sets() -> None:
    assert mask('up{job="api"}') == [True, False, False, False]
    assert mask('{__name__=~".+", job!="api"}') == [False, True, False, True]  # missing: ""
    assert mask('{__name__=~"up|a_.*"}') == [True, True, False, True]
    assert mask('{__name__!~"up", job=~".+"}') == [False, False, True, False]
    assert mask('{code=~"2.."}') == [False, False, True, False]


def test_selectors_matching_the_empty_string_and_bad_regexes_are_refused() -> None:
    for selector in ('{job=""}', '{job=~".*"}', '{job!~".+"}', '{job!="x"}'):
        with pytest.raises(ValueError, match="non-empty matcher"):
            mask(selector)
    with pytest.raises(ValueError, match="invalid regex"):
        mask('{job=~"(a)\\\\1"}')  # a backreference: RE2 refuses it, nothing else runs it
    with pytest.raises(SelectorError):
        parse_selector("up{job=~}")


def test_a_backtracking_pattern_in_a_selector_matches_long_values() -> None:
    # Through the selector path (parsed, then applied per label set): a backtracking
    # engine would need 2^n steps here; RE2's linear time is proven by the ratio test in
    # test_matchers.py (no wall-clock bound here: tests do not assert speed).
    names = pa.array(["m"] * 2)
    labels = pa.array([[("v", "a" * 100_000 + "!")], [("v", "a" * 100_000)]], SETS_LABELS.type)
    assert selector_mask(names, labels, '{v=~"(a+)+$"}') == [False, True]
