"""Bearer-token authentication and per-agent authorization (PROTOCOL §2, DESIGN tokens file).

With no tokens file the collector runs *open*: every request acts as the ``anonymous``
principal that may write every agent_id, read conflicts and query points. The server only allows that
on a loopback address (see `collector.server`).

The PromQL engine reads with an internal principal (PROTOCOL §5): a random token made
for each `Authenticator` (one per collector start), never in the tokens file. It is valid
only for ``POST /api/v1/read``: its principal writes no agent, is no admin and has no
``read`` permission, so every endpoint that checks `Principal.may_read` refuses it (403);
the remote read endpoint admits it through `Authenticator.may_remote_read` and gives its
reads a pool of their own (`Authenticator.is_engine`). It wins over open mode too, so the
engine's reads are told apart from anonymous ones.

An ``Authorization`` header that is not valid UTF-8 (aiohttp hands its bytes over as
lone surrogates) names no token: 401, like any unknown token.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, field

from config.tokens import Principal, TokenTable, hash_token

ANONYMOUS = Principal(name="anonymous", token_sha256="0" * 64, agents=("*",), admin=True, read=True)
ENGINE_PRINCIPAL_NAME = "promql-engine (internal)"


@dataclass(frozen=True, slots=True)
class EngineReadToken:
    """The internal principal's bearer token (`token`, secret) and its principal."""

    token: str = field(repr=False)
    principal: Principal

    @classmethod
    def generate(cls) -> EngineReadToken:
        token = secrets.token_urlsafe(32)
        principal = Principal(name=ENGINE_PRINCIPAL_NAME, token_sha256=hash_token(token))
        return cls(token, principal)

    def matches(self, token: str) -> bool:
        return hmac.compare_digest(hash_token(token), self.principal.token_sha256)


@dataclass(frozen=True, slots=True)
class Authenticator:
    tokens: TokenTable | None
    engine_read: EngineReadToken = field(default_factory=EngineReadToken.generate)
    """The PromQL engine's per-start read token (`collector.promql.engine` writes it to
    the engine's ``credentials_file``)."""

    @property
    def open(self) -> bool:
        return self.tokens is None

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The principal for an ``Authorization`` header, or None (answer 401)."""
        token = _bearer_token(authorization)
        if token is not None and self.engine_read.matches(token):
            return self.engine_read.principal
        if self.tokens is None:
            return ANONYMOUS
        return self.tokens.principal_for_token(token) if token is not None else None

    def is_engine(self, principal: Principal) -> bool:
        """True for the internal principal of this collector's PromQL engine."""
        return principal is self.engine_read.principal

    def may_remote_read(self, principal: Principal) -> bool:
        """``POST /api/v1/read``: a read token, or the engine's internal principal."""
        return principal.may_read or self.is_engine(principal)


def _bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    try:
        token.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes, kept by aiohttp as surrogates
        return None
    return token.strip()
