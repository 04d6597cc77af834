"""The audit's compact sets (`index.digests`) against plain Python sets, including the
corner the two-halves layout must get right: digests sharing their first 64 bits."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pyarrow as pa
import pytest

from index.digests import KeyDigestSet, ShaPrefixSet, digests_from_arrow, digests_of, sha_prefixes


def _digests(raw: list[bytes]) -> np.ndarray:
    return np.frombuffer(b"".join(raw), dtype="V16")


def test_digests_that_share_a_first_half_are_told_apart_and_deduplicated() -> None:
    rng = random.Random(5)
    shared = [rng.randbytes(8) for _ in range(3)]
    # Runs of equal first halves, with the second halves added out of order, twice over.
    members = [prefix + rng.randbytes(8) for prefix in shared for _ in range(6)]
    members += [rng.randbytes(16) for _ in range(500)]
    strangers = [prefix + rng.randbytes(8) for prefix in shared for _ in range(6)]
    strangers += [rng.randbytes(16) for _ in range(500)]
    digests = KeyDigestSet()
    half = len(members) // 2
    digests.add(_digests(members[half:]))
    digests.add(_digests(members[:half] + members[:50]))  # duplicates across chunks
    assert len(digests) == len(set(members))
    assert digests.contains(_digests(members)).all()
    assert not digests.contains(_digests(strangers)).any()
    assert digests.nbytes == 16 * len(set(members))


def test_digest_sets_grow_after_a_query() -> None:
    keys = [f"accepted/v1/k{i}" for i in range(100)]
    digests = KeyDigestSet()
    digests.add_keys(keys[:50])
    assert digests.contains(digests_of(keys)).tolist() == [True] * 50 + [False] * 50
    digests.add_keys(keys[50:])
    assert digests.contains(digests_of(keys)).all() and len(digests) == 100


def test_key_digests_read_from_arrow_match_the_hashed_keys() -> None:
    keys = [f"accepted/v1/k{i}" for i in range(10)]
    column = pa.array([bytes(d) for d in digests_of(keys)], pa.binary(16)).slice(3, 5)
    assert digests_from_arrow(column).tobytes() == digests_of(keys[3:8]).tobytes()


def test_sha_prefixes_of_an_arrow_column_skip_nulls_and_respect_slices() -> None:
    shas = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(20)]
    column = pa.chunked_array([pa.array([*shas[:10], None]), pa.array(shas[10:]).slice(2)])
    expected = [int(sha[:16], 16) for sha in shas[:10] + shas[12:]]
    assert sha_prefixes(column).tolist() == expected
    assert sha_prefixes(shas).tolist() == [int(sha[:16], 16) for sha in shas]
    assert sha_prefixes(pa.array([], pa.string())).tolist() == []


@pytest.mark.parametrize(
    "bad",
    [
        "a" * 65,  # too long: once silently cut to 64 characters
        "a" * 63,
        "A" * 64,
        "g" + "a" * 63,
    ],
)
def test_sha_prefixes_refuse_what_is_not_a_sha256(bad: str) -> None:
    good = hashlib.sha256(b"x").hexdigest()
    with pytest.raises(ValueError):
        sha_prefixes(pa.array([good, bad]))
    with pytest.raises(ValueError):
        sha_prefixes([good, bad])


def test_prefix_sets_answer_membership_and_positions() -> None:
    rng = np.random.default_rng(3)
    values = rng.integers(0, 2**63, 2_000, dtype=np.uint64)
    present = ShaPrefixSet()
    present.add(values[:1_500])
    present.add(values[1_000:1_500])  # duplicates
    assert len(present) == 1_500
    assert present.contains(values).tolist() == [True] * 1_500 + [False] * 500
    where = present.find(values)
    assert (where[1_500:] == -1).all()
    assert (present.values[where[:1_500]] == values[:1_500]).all()
    assert (np.diff(present.values.astype(np.float64)) > 0).all()  # sorted, no duplicates


def test_digests_stored_as_plain_binary_read_like_fixed_size_ones() -> None:
    """A catalog file DuckDB merged stores ``key_digest`` as BLOB (`index.catalog_merge`):
    the audit's scan must read it, not move the file aside as unreadable."""
    import pyarrow as pa
    import pytest

    from index.digests import digests_from_arrow, digests_of, key_digest

    blob = pa.array([key_digest("a"), key_digest("b")], pa.binary())
    assert (digests_from_arrow(blob) == digests_of(["a", "b"])).all()
    with pytest.raises(ValueError, match="not 16 bytes"):
        digests_from_arrow(pa.array([b"short"], pa.binary()))
