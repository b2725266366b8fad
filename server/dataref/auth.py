"""Who is the owner of a call.

Over stdio the owner is the local user (``settings.owner`` overrides). Over streamable HTTP
every request carries a bearer token (static tokens from config, or a JWT) and the owner is
the token's subject; requests without a valid token are refused with 401 by FastMCP's auth
middleware before any tool runs. Custom routes (downloads) are not behind that middleware,
so they call ``owner_from_request`` themselves.
"""

from __future__ import annotations

from typing import Literal

from fastmcp.server.auth import AccessToken, AuthProvider, StaticTokenVerifier
from fastmcp.server.auth.providers.jwt import JWTVerifier
from fastmcp.server.dependencies import get_access_token

from .config import Settings, local_user
from .errors import AccessDenied

Transport = Literal["stdio", "http", "memory"]


def build_auth(settings: Settings) -> AuthProvider | None:
    """The bearer-token verifier for HTTP; None when nothing is configured."""
    auth = settings.auth
    if auth.jwks_uri or auth.public_key:
        return JWTVerifier(
            jwks_uri=auth.jwks_uri,
            public_key=auth.public_key,
            issuer=auth.issuer,
            audience=auth.audience,
            algorithm=auth.algorithm,
        )
    if auth.tokens:
        return StaticTokenVerifier(
            tokens={
                token: {"client_id": owner, "sub": owner, "scopes": []}
                for token, owner in auth.tokens.items()
            }
        )
    return None


def owner_of_token(token: AccessToken) -> str:
    claims = token.claims or {}
    return str(claims.get("sub") or token.subject or token.client_id)


class OwnerResolver:
    """Maps the current request to its owner, by transport."""

    def __init__(self, settings: Settings, transport: Transport) -> None:
        self.transport = transport
        self.local_owner = settings.owner or local_user()

    def current(self) -> str:
        token = get_access_token()
        if token is not None:
            return owner_of_token(token)
        if self.transport == "http":
            # Unreachable behind the auth middleware; refuse rather than fall back to a default.
            raise AccessDenied(
                "this server needs a bearer token - send Authorization: Bearer <token>"
            )
        return self.local_owner
