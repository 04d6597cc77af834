"""Bearer-token authentication and per-agent authorization (PROTOCOL §2, DESIGN tokens file).

With no tokens file the collector runs *open*: every request acts as the ``anonymous``
principal that may write every agent_id, read conflicts and query points. The server only allows that
on a loopback address (see `collector.server`).

An ``Authorization`` header that is not valid UTF-8 (aiohttp hands its bytes over as
lone surrogates) names no token: 401, like any unknown token.
"""

from __future__ import annotations

from dataclasses import dataclass

from config.tokens import Principal, TokenTable

ANONYMOUS = Principal(name="anonymous", token_sha256="0" * 64, agents=("*",), admin=True, read=True)


@dataclass(frozen=True, slots=True)
class Authenticator:
    tokens: TokenTable | None

    @property
    def open(self) -> bool:
        return self.tokens is None

    def authenticate(self, authorization: str | None) -> Principal | None:
        """The principal for an ``Authorization`` header, or None (answer 401)."""
        if self.tokens is None:
            return ANONYMOUS
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        try:
            token.encode("utf-8")
        except UnicodeEncodeError:  # undecodable bytes, kept by aiohttp as surrogates
            return None
        return self.tokens.principal_for_token(token.strip())
