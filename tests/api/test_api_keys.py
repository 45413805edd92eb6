"""API keys an account can rotate and revoke (issue 23): several named keys, last-used times, the old key answering
401 the moment it is replaced, and keys stored only as digests."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine
from tests.conftest import Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _account(stack: Stack) -> str:
    engine = make_engine(stack.settings.resolved_database_url())
    _, key = create_account(engine, name=f"keys-{uuid.uuid4().hex[:8]}")
    engine.dispose()
    return key


async def test_keys_are_named_listed_rotated_and_revoked_and_the_old_key_dies_at_once(stack: Stack) -> None:
    first = _account(stack)
    async with stack.http(first) as http:
        made = await http.post("/v1/account/keys", json={"name": "ci"})
        assert made.status_code == 201, made.text
        ci = made.json()["key"]
        assert made.json()["name"] == "ci" and ci.startswith(made.json()["prefix"])
    async with stack.http(ci) as http:
        assert (await http.get("/v1/account")).status_code == 200
        listed = (await http.get("/v1/account/keys")).json()["keys"]
        assert [(k["name"], k["current"]) for k in listed] == [("default", False), ("ci", True)]
        assert all(k["last_used_at"] is not None for k in listed), "both keys have authenticated a request"
        assert all("key" not in k and "key_hash" not in k for k in listed)

        rotated = await http.post("/v1/account/keys/ci/rotate")
        assert rotated.status_code == 201, rotated.text
        new_ci = rotated.json()["key"]
        assert new_ci != ci and rotated.json()["last_used_at"] is None
        # The old key answers 401 on its very next request.
        gone = await http.get("/v1/account")
        assert gone.status_code == 401 and gone.json()["error"]["code"] == "unauthorized"
    async with stack.http(new_ci) as http:
        assert (await http.get("/v1/account")).status_code == 200
        assert (await http.delete("/v1/account/keys/default")).status_code == 204
    async with stack.http(first) as http:
        assert (await http.get("/v1/account")).status_code == 401, "revoked: 401 at once"
    async with stack.http(new_ci) as http:
        last = await http.delete("/v1/account/keys/ci")
        assert last.status_code == 409 and last.json()["error"]["code"] == "last_key"
        assert (await http.get("/v1/account")).status_code == 200, "the refused revoke changed nothing"


async def test_bad_key_requests_get_clear_answers(stack: Stack) -> None:
    key = _account(stack)
    async with stack.http(key) as http:
        assert (await http.post("/v1/account/keys", json={"name": "../etc"})).status_code == 422
        assert (await http.post("/v1/account/keys", json={"name": "dup"})).status_code == 201
        dup = await http.post("/v1/account/keys", json={"name": "dup"})
        assert dup.status_code == 409 and dup.json()["error"]["code"] == "key_exists"
        missing = await http.post("/v1/account/keys/nope/rotate")
        assert missing.status_code == 404
        assert (await http.delete("/v1/account/keys/nope")).status_code == 404
        for _ in range(18):  # 2 so far; at most 20
            assert (await http.post("/v1/account/keys", json={})).status_code == 201
        many = await http.post("/v1/account/keys", json={})
        assert many.status_code == 409 and many.json()["error"]["code"] == "too_many_keys"


async def test_one_account_cannot_touch_anothers_keys(stack: Stack) -> None:
    mine, theirs = _account(stack), _account(stack)
    async with stack.http(theirs) as http:
        assert (await http.post("/v1/account/keys", json={"name": "theirs"})).status_code == 201
    async with stack.http(mine) as http:
        assert (await http.post("/v1/account/keys/theirs/rotate")).status_code == 404
        assert (await http.delete("/v1/account/keys/theirs")).status_code == 404
        assert [k["name"] for k in (await http.get("/v1/account/keys")).json()["keys"]] == ["default"]
    async with stack.http(theirs) as http:
        assert (await http.get("/v1/account")).status_code == 200


async def test_keys_rest_only_as_digests(stack: Stack) -> None:
    key = _account(stack)
    engine = make_engine(stack.settings.resolved_database_url())
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT * FROM api_keys")).all()
    engine.dispose()
    assert rows and not any(key in repr(row) for row in rows)
