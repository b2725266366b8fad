"""Auth: JWT bearer tokens make the token's subject the owner; bad tokens get 401."""

from __future__ import annotations

import pytest
from fastmcp.exceptions import ToolError
from fastmcp.server.auth.providers.jwt import RSAKeyPair
from fastmcp.utilities.tests import asgi_server

from dataref.app import create_app

from .conftest import make_settings

ISSUER = "https://issuer.example"
AUDIENCE = "dataref"


@pytest.fixture(scope="module")
def keys() -> RSAKeyPair:
    return RSAKeyPair.generate()


async def test_a_jwt_subject_is_the_owner_and_owners_stay_apart(tmp_path, keys):
    settings = make_settings(
        tmp_path,
        auth={"public_key": keys.public_key, "issuer": ISSUER, "audience": AUDIENCE},
        demo={"grants": {"bob": ["Online"]}},
    )
    alice_token = keys.create_token(subject="alice", issuer=ISSUER, audience=AUDIENCE)
    bob_token = keys.create_token(subject="bob", issuer=ISSUER, audience=AUDIENCE)
    async with asgi_server(create_app(settings, "http", kernels=False)) as server:
        async with server.client(auth=alice_token) as alice:
            ref = (await alice.call_tool("fetch_sales", {"since": "2025-12-01"})).structured_content
            stats = await alice.call_tool("describe_data", {"dataRef": ref["dataRef"]})
            assert stats.structured_content["columns"]["region"]["unique"] == 6
        async with server.client(auth=bob_token) as bob:
            mine = (await bob.call_tool("fetch_sales", {"since": "2025-12-01"})).structured_content
            assert {row["region"] for row in mine["sample"]} == {"Online"}
            with pytest.raises(ToolError, match="fetch the data again"):
                await bob.call_tool("describe_data", {"dataRef": ref["dataRef"]})


async def test_a_jwt_for_another_audience_or_issuer_is_refused(tmp_path, keys):
    settings = make_settings(
        tmp_path, auth={"public_key": keys.public_key, "issuer": ISSUER, "audience": AUDIENCE}
    )
    wrong_audience = keys.create_token(subject="mallory", issuer=ISSUER, audience="other")
    wrong_issuer = keys.create_token(subject="mallory", issuer="https://evil", audience=AUDIENCE)
    async with asgi_server(create_app(settings, "http", kernels=False)) as server:
        headers = {"accept": "application/json, text/event-stream"}
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        async with server.http_client() as http:
            for token in (wrong_audience, wrong_issuer, "not-a-jwt"):
                response = await http.post(
                    "/mcp", json=body, headers={**headers, "authorization": f"Bearer {token}"}
                )
                assert response.status_code == 401
            assert (await http.post("/mcp", json=body, headers=headers)).status_code == 401
