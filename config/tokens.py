"""The tokens file (``auth.tokens_file``): bearer tokens → principals → agent_id globs.

One ``[[principal]]`` table per principal::

    [[principal]]
    name = "fleet-eu"
    token_sha256 = "<64 hex digits: sha256 of the bearer token>"
    agents = ["eu-*", "canary-1"]     # fnmatch globs of agent_id it may write
    admin = false                      # admin endpoints (GET /v1/conflicts)
    read = false                       # GET /v1/query (live queries)

Plaintext tokens are never stored; `generate_token` makes a token and its entry.
``admin`` does not widen ``agents``: an admin that also writes lists ``agents = ["*"]``.
``read`` (``GET /v1/query``) is a permission of its own: neither ``admin`` nor ``agents``
implies it, and a read-only principal has ``agents = []``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from config.errors import SettingsError, SettingsProblem, describe_error, loc_to_key
from config.loader import read_toml_file

# Names and patterns are printed in logs and written back into TOML by
# `principal_toml`; control characters would break both.
_PRINTABLE = r"^[^\x00-\x1f\x7f]+$"


def _lowercase_hex(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


class Principal(BaseModel):
    """One identity that may present a bearer token."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=_PRINTABLE)
    token_sha256: Annotated[str, BeforeValidator(_lowercase_hex), Field(pattern=r"^[0-9a-f]{64}$")]
    """Lowercase hex SHA-256 of the UTF-8 bearer token (upper case is accepted)."""
    agents: tuple[Annotated[str, Field(min_length=1, pattern=_PRINTABLE)], ...] = ()
    """Glob patterns (`fnmatch.fnmatchcase`) of the agent_ids it may write."""
    admin: bool = False
    read: bool = False
    """May read points (``GET /v1/query``)."""

    @property
    def may_read(self) -> bool:
        return self.read

    def may_write(self, agent_id: str) -> bool:
        """True when ``agent_id`` matches one of `agents` (case-sensitive)."""
        return any(fnmatchcase(agent_id, pattern) for pattern in self.agents)


def hash_token(token: str) -> str:
    """The ``token_sha256`` of a bearer token: hex SHA-256 of its UTF-8 bytes."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenTable:
    """Principals indexed by token hash. Construction checks that names and token
    hashes are unique (`SettingsError` naming ``source`` otherwise)."""

    def __init__(self, principals: Iterable[Principal], *, source: str = "<tokens>") -> None:
        self.source = source
        self.principals: tuple[Principal, ...] = tuple(principals)
        problems: list[SettingsProblem] = []
        by_name: dict[str, int] = {}
        self._by_hash: dict[str, Principal] = {}
        first_with_hash: dict[str, int] = {}
        for index, principal in enumerate(self.principals):
            where = _where(index, principal.name)
            if principal.name in by_name:
                problem = f"duplicate name, also used by principal[{by_name[principal.name]}]"
                problems.append(SettingsProblem(where, source, problem))
            by_name.setdefault(principal.name, index)
            digest = principal.token_sha256
            if digest in first_with_hash:
                other = first_with_hash[digest]
                problem = (
                    f"duplicate token_sha256, also used by principal[{other}] "
                    f"({self.principals[other].name!r}); every principal needs its own token"
                )
                problems.append(SettingsProblem(where, source, problem))
            else:
                first_with_hash[digest] = index
                self._by_hash[digest] = principal
        if problems:
            raise SettingsError(problems)

    def __len__(self) -> int:
        return len(self.principals)

    def principal_for_token(self, token: str) -> Principal | None:
        """The principal whose ``token_sha256`` is the hash of ``token``, or ``None``.

        The dictionary lookup is on the hash, so timing reveals nothing about the token
        itself; the final comparison is constant-time all the same."""
        if not token:
            return None
        digest = hash_token(token)
        principal = self._by_hash.get(digest)
        if principal is None or not hmac.compare_digest(principal.token_sha256, digest):
            return None
        return principal


def load_tokens(path: Path) -> TokenTable:
    """Read and validate the tokens file. `SettingsError` names the file, the principal
    (index and name) and the problem, for every problem found."""
    source = str(path)
    document = read_toml_file(path)
    problems: list[SettingsProblem] = []
    for key in document:
        if key != "principal":
            problems.append(SettingsProblem(key, source, "unknown key; expected [[principal]]"))
    entries = document.get("principal", [])
    if not isinstance(entries, list):
        problem = "must be an array of tables, written [[principal]]"
        raise SettingsError([*problems, SettingsProblem("principal", source, problem)])
    principals: list[Principal] = []
    for index, entry in enumerate(entries):
        try:
            principals.append(Principal.model_validate(entry))
        except ValidationError as exc:
            name = entry.get("name") if isinstance(entry, dict) else None
            where = _where(index, name if isinstance(name, str) else None)
            for error in exc.errors(include_url=False):
                field = loc_to_key(error["loc"])
                problem = describe_error(error)
                key = f"{where}.{field}" if field else where
                problems.append(SettingsProblem(key, source, problem))
    if problems:
        raise SettingsError(problems)
    return TokenTable(principals, source=source)


TOKEN_ENV = "LM_TOKEN"


def client_token(token_file: Path | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The bearer token a client command sends: the contents of ``token_file`` when given,
    else the ``LM_TOKEN`` environment variable (kept off the command line and out of
    ``ps``), else None. `SettingsError` for an unreadable or empty file."""
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsError(
                [SettingsProblem("--token-file", str(token_file), str(exc))]
            ) from None
        if not token:
            raise SettingsError([SettingsProblem("--token-file", str(token_file), "is empty")])
        return token
    value = (os.environ if environ is None else environ).get(TOKEN_ENV, "").strip()
    return value or None


def _where(index: int, name: str | None) -> str:
    return f"principal[{index}] ({name!r})" if name else f"principal[{index}]"


@dataclass(frozen=True, slots=True)
class GeneratedToken:
    """A new bearer token (give it to the agent; it is not stored anywhere) and the
    tokens-file entry that admits it."""

    token: str
    principal: Principal
    toml: str


def generate_token(
    name: str,
    agents: Sequence[str],
    *,
    admin: bool = False,
    read: bool = False,
    token_bytes: Callable[[int], bytes] = secrets.token_bytes,
) -> GeneratedToken:
    """A fresh ``lm_``-prefixed token of 256 random bits and its ``[[principal]]`` entry.
    Raises `pydantic.ValidationError` for an invalid name or pattern."""
    token = "lm_" + base64.urlsafe_b64encode(token_bytes(32)).decode("ascii").rstrip("=")
    principal = Principal(
        name=name, token_sha256=hash_token(token), agents=tuple(agents), admin=admin, read=read
    )
    return GeneratedToken(token=token, principal=principal, toml=principal_toml(principal))


def principal_toml(principal: Principal) -> str:
    """The ``[[principal]]`` table for ``principal``, ready to append to a tokens file."""

    # A JSON string without control characters (the model forbids them) is a valid TOML
    # basic string; ensure_ascii=False avoids surrogate-pair escapes TOML rejects.
    def quote(text: str) -> str:
        return json.dumps(text, ensure_ascii=False)

    agents = ", ".join(quote(pattern) for pattern in principal.agents)
    return (
        "[[principal]]\n"
        f"name = {quote(principal.name)}\n"
        f'token_sha256 = "{principal.token_sha256}"\n'
        f"agents = [{agents}]\n"
        f"admin = {'true' if principal.admin else 'false'}\n"
        f"read = {'true' if principal.read else 'false'}\n"
    )
