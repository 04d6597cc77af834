"""The ledger setsum: definition pinned, order-independent, sensitive to loss and doubling."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from protocol.setsum import MODULUS, Setsum, batch_term

PAIRS = st.lists(
    st.tuples(st.text(min_size=1, max_size=20), st.text(min_size=1, max_size=8)), max_size=20
)


def test_definition_is_sha256_of_id_newline_sha_big_endian_mod_2_256() -> None:
    expected = int.from_bytes(hashlib.sha256(b"agent=61.boot=01.x\nab").digest(), "big")
    assert batch_term("agent=61.boot=01.x", "ab") == expected
    both = Setsum.of([("m1", "s1"), ("m2", "s2")])
    assert both.value == (batch_term("m1", "s1") + batch_term("m2", "s2")) % MODULUS
    assert len(both.hex) == 64 and Setsum.from_hex(both.hex) == both


def test_empty_setsum_is_zero_hex() -> None:
    assert Setsum().hex == "0" * 64


@given(PAIRS, st.randoms())
def test_order_independent_and_incremental(pairs: list[tuple[str, str]], rnd: object) -> None:
    shuffled = list(pairs)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    incremental = Setsum()
    for manifest_id, sha in shuffled:
        incremental = incremental.add(manifest_id, sha)
    assert incremental == Setsum.of(pairs)
    for manifest_id, sha in pairs:
        incremental = incremental.remove(manifest_id, sha)
    assert incremental == Setsum()


@given(PAIRS.filter(bool))
def test_missing_or_doubled_batch_changes_the_sum(pairs: list[tuple[str, str]]) -> None:
    whole = Setsum.of(pairs)
    assert Setsum.of(pairs[1:]) != whole
    assert Setsum.of([*pairs, pairs[0]]) != whole
