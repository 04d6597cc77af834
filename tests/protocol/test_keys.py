"""Pin every key format of PROTOCOL §3-§4 for one known identity, and round-trip the parsers."""

from __future__ import annotations

import uuid

import pytest

from protocol import keys

IDENTITY = keys.BatchIdentity(
    agent_id="agent-a",
    boot_id=uuid.UUID("5f0c7a3e-1d2b-4c3a-9e8f-0123456789ab"),
    seq_start=10,
    seq_end=20,
)
SHA = "abcd" + "0" * 60
HOUR = keys.UtcHour.from_unix_ns(1_763_719_200_000_000_000)  # 2025-11-21T10:00:00Z
AGENT = "6167656e742d61"
BOOT = "5f0c7a3e1d2b4c3a9e8f0123456789ab"
SEQ = "00000000000000000010-00000000000000000020"


def test_hour_and_identity_encodings() -> None:
    assert HOUR.partition == "date=2025-11-21/hour=10"
    assert HOUR.iso == "2025-11-21T10"
    assert IDENTITY.manifest_id == f"agent={AGENT}.boot={BOOT}.{SEQ}"


@pytest.mark.parametrize(
    ("built", "expected"),
    [
        (keys.raw_blob_key(SHA), f"raw-blobs/v1/sha256/ab/cd/{SHA}.lmbatch"),
        (
            keys.raw_blob_by_time_key(HOUR, SHA),
            f"raw-blobs-by-time/v1/date=2025-11-21/hour=10/sha256={SHA}.json",
        ),
        (keys.accepted_manifest_key(IDENTITY), f"accepted/v1/agent={AGENT}/boot={BOOT}/{SEQ}.json"),
        (
            keys.accepted_by_time_key(HOUR, IDENTITY),
            f"accepted-by-time/v1/date=2025-11-21/hour=10/agent={AGENT}.boot={BOOT}.{SEQ}.json",
        ),
        (
            keys.accepted_by_blob_key(SHA, IDENTITY),
            f"accepted-by-blob/v1/sha256/ab/cd/{SHA}/agent={AGENT}/boot={BOOT}/{SEQ}.json",
        ),
        (
            keys.quarantine_key(IDENTITY, SHA),
            f"quarantine/v1/identity-conflict/agent={AGENT}/boot={BOOT}/{SEQ}/{SHA}.json",
        ),
        (
            keys.quarantine_by_blob_key(SHA, IDENTITY),
            f"quarantine-by-blob/v1/sha256/ab/cd/{SHA}/agent={AGENT}/boot={BOOT}/{SEQ}.json",
        ),
        (keys.gc_mark_key(SHA), f"gc/v1/marks/{SHA}.json"),
        (keys.gc_veto_key(SHA), f"gc/v1/vetoes/{SHA}.json"),
        (
            keys.gc_log_key(1_763_719_200_000_000_123, 7),
            "gc/v1/log/date=2025-11-21/hour=10/01763719200000000123-7.parquet",
        ),
        (keys.catalog_created_key(3, 9), "index/v1/catalog-created/0000000003-0000000009"),
        (
            keys.quarantine_identity_prefixes(IDENTITY)[0],
            f"quarantine/v1/identity-conflict/agent={AGENT}/boot={BOOT}/{SEQ}/",
        ),
        (keys.rollup_dirty_key(HOUR), "work/v1/rollup-dirty/date=2025-11-21/hour=10.json"),
        (
            keys.rollup_manifest_key(7, "c0ffee"),
            "rollup/v1/manifests/v00000000000000000007-c0ffee.json",
        ),
        (
            keys.rollup_data_key("points", HOUR, "u1"),
            "rollup/v1/tables/points/date=2025-11-21/hour=10/u1.parquet",
        ),
        (keys.rollup_ledger_key(HOUR, "u1"), "rollup/v1/ledger/date=2025-11-21/hour=10/u1.parquet"),
        (keys.ROLLUP_POINTER_KEY, "rollup/v1/_latest_manifest"),
        (keys.ROLLUP_OWNER_KEY, "rollup/v1/owner.json"),
    ],
)
def test_key_strings_are_pinned(built: str, expected: str) -> None:
    assert built == expected


def test_parsers_invert_builders() -> None:
    named = IDENTITY.key_identity
    assert keys.parse_raw_blob_key(keys.raw_blob_key(SHA)) == SHA
    assert keys.parse_raw_blob_by_time_key(keys.raw_blob_by_time_key(HOUR, SHA)) == (HOUR, SHA)
    assert keys.parse_catalog_created_key(keys.catalog_created_key(3, 9)) == (3, 9)
    assert keys.parse_gc_mark_key(keys.gc_mark_key(SHA)) == SHA
    assert keys.parse_accepted_manifest_key(keys.accepted_manifest_key(IDENTITY)) == named
    assert keys.parse_accepted_by_blob_key(keys.accepted_by_blob_key(SHA, IDENTITY)) == (
        SHA,
        named,
    )
    assert keys.parse_quarantine_key(keys.quarantine_key(IDENTITY, SHA)) == (named, SHA)
    assert keys.parse_manifest_id(IDENTITY.manifest_id) == named
    # A key that spells the agent in hex gives the whole identity back.
    assert keys.parse_accepted_manifest_key(keys.accepted_manifest_key(IDENTITY)).identity == (
        IDENTITY
    )


def test_unicode_agent_id_round_trips() -> None:
    identity = keys.BatchIdentity("höst/ünïcode", IDENTITY.boot_id, 0, 0)
    key = keys.accepted_manifest_key(identity)
    assert "/" not in identity.agent_hex
    assert keys.parse_accepted_manifest_key(key).identity == identity


def _agent(length: int) -> str:
    return ("a" * length)[:length]


def _segments_of(identity: keys.BatchIdentity) -> list[str]:
    built = [
        keys.accepted_manifest_key(identity),
        keys.accepted_by_time_key(HOUR, identity),
        keys.accepted_by_blob_key(SHA, identity),
        keys.quarantine_key(identity, SHA),
        keys.quarantine_by_blob_key(SHA, identity),
        keys.identity_name(identity, f".{SHA}.lmbatch"),
    ]
    return [segment for key in built for segment in key.split("/")]


@pytest.mark.parametrize("length", [1, 82, 83, 124, 125, 128])
def test_no_segment_exceeds_255_bytes_for_any_agent_id(length: int) -> None:
    """PROTOCOL §3's segment rule, for every key and name that embeds an identity."""
    identity = keys.BatchIdentity(_agent(length), IDENTITY.boot_id, 0, keys.MAX_U64)
    assert max(len(s.encode()) for s in _segments_of(identity)) <= keys.SEGMENT_MAX_BYTES
    # ... with multi-byte characters too (128 bytes of "é" is 64 characters).
    wide = keys.BatchIdentity("é" * (length // 2 or 1), IDENTITY.boot_id, 0, 0)
    assert max(len(s.encode()) for s in _segments_of(wide)) <= keys.SEGMENT_MAX_BYTES


@pytest.mark.parametrize(
    ("length", "manifest_hashed", "by_time_hashed"),
    [
        (82, False, False),
        (83, False, True),
        (124, False, True),
        (125, True, True),
        (128, True, True),
    ],
)
def test_the_agent_is_hashed_only_where_its_hex_would_not_fit(
    length: int, manifest_hashed: bool, by_time_hashed: bool
) -> None:
    identity = keys.BatchIdentity(_agent(length), IDENTITY.boot_id, 1, 2)
    digest = f"agent=h-{identity.agent_sha256}"
    long_form = f"agent={identity.agent_hex}"
    manifest_key = keys.accepted_manifest_key(identity)
    by_time = keys.accepted_by_time_key(HOUR, identity)
    assert (digest in manifest_key, long_form in manifest_key) == (
        manifest_hashed,
        not manifest_hashed,
    )
    assert (digest in by_time, long_form in by_time) == (by_time_hashed, not by_time_hashed)
    # Where the key is hashed the long form is the legacy one to look for first.
    legacy = keys.legacy_accepted_manifest_key(identity)
    assert (legacy is not None) == manifest_hashed
    if legacy is not None:
        assert legacy == f"accepted/v1/{long_form}/boot={BOOT}/{identity.seq_range}.json"
        assert keys.parse_accepted_manifest_key(legacy) == identity.key_identity
    assert (keys.legacy_quarantine_key(identity, SHA) is not None) == manifest_hashed
    # The ledger's manifest_id is never hashed: ledgers written before the rule stay valid.
    assert identity.manifest_id.startswith(long_form + ".")


@pytest.mark.parametrize("length", [125, 128])
def test_a_hashed_key_names_the_identity_without_spelling_it(length: int) -> None:
    identity = keys.BatchIdentity(_agent(length), IDENTITY.boot_id, 1, 2)
    other = keys.BatchIdentity(_agent(length - 1) + "b", IDENTITY.boot_id, 1, 2)
    named = keys.parse_accepted_manifest_key(keys.accepted_manifest_key(identity))
    assert named.agent_id is None and named.identity is None
    assert keys.identity_matches_key(identity, named)
    assert not keys.identity_matches_key(other, named)
    assert not keys.identity_matches_key(
        keys.BatchIdentity(identity.agent_id, IDENTITY.boot_id, 1, 3), named
    )
    # Both forms of one batch are one KeyIdentity (sets and dicts merge them).
    long_named = keys.parse_manifest_id(identity.manifest_id)
    assert long_named == named and hash(long_named) == hash(named)
    assert long_named.identity == identity


def test_quarantine_prefixes_cover_both_forms_of_a_long_agent() -> None:
    short = keys.BatchIdentity("agent-a", IDENTITY.boot_id, 1, 2)
    assert keys.quarantine_agent_prefixes("agent-a") == [
        f"{keys.QUARANTINE_PREFIX}agent={short.agent_hex}/"
    ]
    long_agent = keys.BatchIdentity(_agent(128), IDENTITY.boot_id, 1, 2)
    prefixes = keys.quarantine_agent_prefixes(long_agent.agent_id)
    assert keys.quarantine_key(long_agent, SHA).startswith(prefixes[0])
    legacy = keys.legacy_quarantine_key(long_agent, SHA)
    assert legacy is not None and legacy.startswith(prefixes[1])


@pytest.mark.parametrize(
    "bad",
    [
        f"accepted/v1/agent={AGENT}/boot={BOOT}/{SEQ}.jsonx",
        f"accepted/v1/agent={AGENT}/boot={BOOT[:-2]}/{SEQ}.json",
        f"accepted/v1/agent=ff/boot={BOOT}/{SEQ}.json",  # not UTF-8
        f"accepted/v1/agent={AGENT}/boot={BOOT}/00000000000000000020-00000000000000000010.json",
        f"accepted/v1/agent={AGENT}/boot={'0' * 32}/{SEQ}.json",
        f"raw-blobs/v1/sha256/ab/ce/{SHA}.lmbatch",
        f"accepted/v1/agent=h-{SHA[:-2]}/boot={BOOT}/{SEQ}.json",  # digest too short
        f"accepted/v1/agent=h-{SHA.upper()}/boot={BOOT}/{SEQ}.json",
    ],
)
def test_malformed_keys_are_refused(bad: str) -> None:
    with pytest.raises(keys.KeyFormatError):
        if bad.startswith("raw-blobs"):
            keys.parse_raw_blob_key(bad)
        else:
            keys.parse_accepted_manifest_key(bad)


@pytest.mark.parametrize("sha", ["ABCD" + "0" * 60, "ab" * 31, "g" * 64])
def test_bad_sha_is_refused(sha: str) -> None:
    with pytest.raises(keys.KeyFormatError, match="64 lowercase hex"):
        keys.raw_blob_key(sha)


def test_identity_validation_names_the_problem() -> None:
    with pytest.raises(keys.KeyFormatError, match="seq_start <= seq_end"):
        keys.BatchIdentity("a", IDENTITY.boot_id, 5, 4)
    with pytest.raises(keys.KeyFormatError, match=r"1\.\.128"):
        keys.BatchIdentity("x" * 129, IDENTITY.boot_id, 0, 0)
    with pytest.raises(keys.KeyFormatError, match="all zero"):
        keys.BatchIdentity("a", uuid.UUID(int=0), 0, 0)


def test_hour_arithmetic_crosses_days() -> None:
    late = keys.UtcHour.parse_partition("date=2025-12-31/hour=23")
    assert late.next().partition == "date=2026-01-01/hour=00"
    assert late.shifted(-24).iso == "2025-12-30T23"
    assert keys.UtcHour.parse_iso(late.iso) == late
    assert len(keys.hours_between(late.shifted(-3), late)) == 4
    assert keys.UtcHour.from_unix_ns(late.start_ns) == late
