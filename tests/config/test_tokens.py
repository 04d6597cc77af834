"""The tokens file: loading, lookup by bearer token, agent globs, admin, bad files."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import pytest

from config import (
    Principal,
    SettingsError,
    TokenTable,
    generate_token,
    hash_token,
    load_tokens,
)

FLEET = "fleet-token-for-tests"
OPS = "ops-token-for-tests"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tokens.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def table(tmp_path: Path) -> TokenTable:
    path = write(
        tmp_path,
        f"""
        [[principal]]
        name = "fleet"
        token_sha256 = "{hash_token(FLEET)}"
        agents = ["eu-*", "canary-1", "rack[0-9]-*"]

        [[principal]]
        name = "ops"
        token_sha256 = "{hash_token(OPS).upper()}"
        admin = true
        """,
    )
    return load_tokens(path)


def test_hash_token_is_sha256_hex_of_utf8() -> None:
    assert hash_token("tökén") == hashlib.sha256("tökén".encode()).hexdigest()


def test_lookup_by_token(table: TokenTable) -> None:
    fleet = table.principal_for_token(FLEET)
    ops = table.principal_for_token(OPS)
    assert fleet is not None and fleet.name == "fleet" and not fleet.admin
    assert ops is not None and ops.name == "ops" and ops.admin
    assert ops.token_sha256 == hash_token(OPS)  # upper-case hex is normalized
    assert len(table) == 2


@pytest.mark.parametrize("token", ["", "unknown", FLEET + " ", FLEET.upper(), hash_token(FLEET)])
def test_unknown_tokens_find_nobody(table: TokenTable, token: str) -> None:
    assert table.principal_for_token(token) is None


@pytest.mark.parametrize(
    ("agent_id", "allowed"),
    [
        ("eu-1", True),
        ("eu-", True),
        ("EU-1", False),  # case-sensitive
        ("us-1", False),
        ("canary-1", True),
        ("canary-10", False),
        ("rack3-a", True),
        ("rackx-a", False),
    ],
)
def test_agent_globs(table: TokenTable, agent_id: str, allowed: bool) -> None:
    fleet = table.principal_for_token(FLEET)
    assert fleet is not None
    assert fleet.may_write(agent_id) is allowed


def test_admin_without_agents_writes_nothing(table: TokenTable) -> None:
    ops = table.principal_for_token(OPS)
    assert ops is not None
    assert not ops.may_write("eu-1")


def test_empty_file_has_no_principals(tmp_path: Path) -> None:
    table = load_tokens(write(tmp_path, "# nobody yet\n"))
    assert len(table) == 0
    assert table.principal_for_token("anything") is None


def test_generate_token_round_trips_through_the_file(tmp_path: Path) -> None:
    generated = generate_token(
        'fleet "quoted" ü', ["eu-*"], admin=True, token_bytes=lambda n: b"\x01" * n
    )
    assert generated.token.startswith("lm_")
    assert len(generated.token) == 3 + 43
    assert tomllib.loads(generated.toml)["principal"][0]["name"] == 'fleet "quoted" ü'
    table = load_tokens(write(tmp_path, generated.toml))
    assert table.principal_for_token(generated.token) == generated.principal
    assert generated.principal.admin


def test_read_permission_is_its_own(tmp_path: Path) -> None:
    reader = generate_token("dashboards", [], read=True)
    writer = generate_token("fleet", ["*"], admin=True)
    table = load_tokens(write(tmp_path, reader.toml + "\n" + writer.toml))
    found_reader = table.principal_for_token(reader.token)
    found_writer = table.principal_for_token(writer.token)
    assert found_reader is not None and found_reader.may_read
    assert not found_reader.may_write("anything")
    assert found_writer is not None and not found_writer.may_read  # admin does not imply it


def test_client_token_from_file_or_environment(tmp_path: Path) -> None:
    from config.errors import SettingsError
    from config.tokens import client_token

    (tmp_path / "t").write_text("  secret\n")
    assert client_token(tmp_path / "t", {"LM_TOKEN": "env"}) == "secret"
    assert client_token(None, {"LM_TOKEN": " env "}) == "env"
    assert client_token(None, {}) is None
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(SettingsError, match="empty"):
        client_token(tmp_path / "empty", {})


def test_generated_tokens_differ() -> None:
    assert generate_token("a", []).token != generate_token("a", []).token


def principal_entry(name: str, digest: str, extra: str = "") -> str:
    return f'[[principal]]\nname = "{name}"\ntoken_sha256 = "{digest}"\n{extra}\n'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            principal_entry("a", "abc"),
            "principal[0] ('a').token_sha256 in {path}: must match the pattern",
        ),
        (
            principal_entry("a", "g" * 64),
            "principal[0] ('a').token_sha256 in {path}: must match the pattern",
        ),
        (
            principal_entry("a", "a" * 64) + principal_entry("a", "b" * 64),
            "principal[1] ('a') in {path}: duplicate name, also used by principal[0]",
        ),
        (
            principal_entry("a", "a" * 64) + principal_entry("b", "a" * 64),
            "principal[1] ('b') in {path}: duplicate token_sha256, also used by principal[0]",
        ),
        (
            principal_entry("a", "a" * 64, "admn = true"),
            "principal[0] ('a').admn in {path}: unknown key",
        ),
        (
            principal_entry("a", "a" * 64, 'agents = "eu-*"'),
            "principal[0] ('a').agents in {path}: must be a list",
        ),
        (
            '[[principal]]\ntoken_sha256 = "' + "a" * 64 + '"\n',
            "principal[0].name in {path}: is required",
        ),
        ('[principal]\nname = "a"\n', "principal in {path}: must be an array of tables"),
        ("[[principals]]\n", "principals in {path}: unknown key; expected [[principal]]"),
        ("[[principal]\n", "{path}: invalid TOML at line 1"),
    ],
)
def test_bad_files_name_file_principal_and_problem(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SettingsError) as exc:
        load_tokens(path)
    assert expected.format(path=path) in str(exc.value)


def test_table_from_principals_checks_duplicates() -> None:
    one = Principal(name="a", token_sha256="a" * 64)
    with pytest.raises(SettingsError, match="duplicate name"):
        TokenTable([one, one], source="test")
