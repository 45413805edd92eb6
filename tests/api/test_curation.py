"""Solo curation on the embedded stack (issue 22): the stack's own account curates its OWN private benchmarks
(promotes their impls, so `--impl latest:official` works without a second admin account) and nobody else's; the
launch says plainly when a run will not reach a leaderboard and why; `leaderboard` takes names as well as ids and
refuses an ambiguous name listing the matches."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine
from tests.api.helpers import launch, wait_terminal
from tests.cli.test_cli_launch import bw
from tests.conftest import SAMPLE, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")


def _key(stack: Stack, **grants: bool) -> str:
    engine = make_engine(stack.settings.resolved_database_url())
    try:
        return create_account(engine, name=f"cur-{uuid.uuid4().hex[:8]}", balance_usd=100.0, local_paths=True,
                              **grants)[1]
    finally:
        engine.dispose()


def _model(stack: Stack) -> dict[str, Any]:
    return {"identifier": "openai/dev", "api_base": stack.dev_url}


async def _published(stack: Stack, http: httpx.AsyncClient, bench: str, subset: str) -> dict[str, Any]:
    run = await launch(http, {"dataset": DATASET, "model": _model(stack)})
    await wait_terminal(http, run["id"])
    resp = await http.post("/v1/registry/publish", json={"run_id": run["id"], "benchmark": bench, "subset": subset,
                                                          "visibility": "private"})
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


async def test_the_embedded_stacks_own_account_is_a_curator(tmp_path: Path) -> None:
    from sqlmodel import Session, select

    from benchwright.settings import Settings
    from benchwright.stack.supervisor import DEV_ACCOUNT, _ensure_dev_key
    from benchwright.store.models import Account

    _ensure_dev_key(tmp_path)
    engine = make_engine(Settings(data_dir=tmp_path).resolved_database_url())
    with Session(engine) as session:
        account = session.execute(select(Account).where(Account.name == DEV_ACCOUNT)).scalar_one()
        assert account.curator and not account.admin  # curates its own benchmarks; halts nobody else's runs


async def test_a_curator_promotes_on_its_own_private_benchmark_only(stack: Stack) -> None:
    solo, rival, plain = _key(stack, curator=True), _key(stack, curator=True), _key(stack)
    bench, subset = f"solo-{uuid.uuid4().hex[:6]}", "all"
    async with stack.http(solo) as me, stack.http(rival) as them, stack.http(plain) as nobody:
        pub = await _published(stack, me, bench, subset)
        pinned = {"benchmark": bench, "subset": subset, "impl": "latest:official", "model": _model(stack)}
        before = await me.post("/v1/runs", json=pinned)
        assert before.status_code == 404 and before.json()["error"]["code"] == "impl_not_found"

        # another curator, and an account that curates nothing, cannot touch it (it is not even visible to them)
        assert (await them.post(f"/v1/registry/impls/{pub['impl_id']}/promote")).status_code == 404
        assert (await nobody.post(f"/v1/registry/impls/{pub['impl_id']}/promote")).status_code == 404
        # nor can a curator curate another account's private benchmark it owns nothing of
        theirs = await _published(stack, them, f"rival-{uuid.uuid4().hex[:6]}", subset)
        assert (await me.post(f"/v1/registry/impls/{theirs['impl_id']}/promote")).status_code == 404

        promoted = await me.post(f"/v1/registry/impls/{pub['impl_id']}/promote")
        assert promoted.status_code == 200 and promoted.json()["official"] is True
        launched = await me.post("/v1/runs", json=pinned)
        assert launched.status_code == 201, launched.text
        note = launched.json()["off_leaderboard"]
        assert f"its benchmark '{bench}'" in note and "is private" in note
        await wait_terminal(me, launched.json()["id"])

        # the CLI says it plainly at launch
        env = {"BENCHWRIGHT_API_URL": stack.api_url, "BENCHWRIGHT_API_KEY": solo}
        said = await bw("run", "--benchmark", bench, "--subset", subset, "--model", "openai/dev", "--api-base",
                        stack.dev_url, env=env)
        assert said.rc == 0, said.err
        assert "will not appear on a leaderboard: its benchmark" in said.err and "is private" in said.err

        # going public: the owner's own promotion does not carry over (only an admin makes impls official for all)
        made_public = await me.patch(f"/v1/registry/benchmarks/{pub['benchmark_id']}", json={"visibility": "public"})
        assert made_public.status_code == 200, made_public.text
        assert (await me.get(f"/v1/registry/impls/{pub['impl_id']}")).json()["official"] is False
        again = await me.post(f"/v1/registry/impls/{pub['impl_id']}/promote")
        assert again.status_code == 400 and again.json()["error"]["code"] == "promotion_refused"
        # a dataset launch is on no benchmark, and says so
        unfiled = await launch(me, {"dataset": DATASET, "model": _model(stack)})
        assert "on no benchmark" in unfiled["off_leaderboard"]
        await wait_terminal(me, unfiled["id"])


async def test_leaderboard_by_name_and_an_ambiguous_name_lists_the_matches(stack: Stack) -> None:
    owner, other, admin = _key(stack), _key(stack), _key(stack, admin=True)
    shared = f"sub-{uuid.uuid4().hex[:6]}"
    first, second = f"lb-a-{uuid.uuid4().hex[:6]}", f"lb-b-{uuid.uuid4().hex[:6]}"
    async with stack.http(owner) as a, stack.http(other) as b, stack.http(admin) as adm:
        pub_a = await _published(stack, a, first, shared)
        pub_b = await _published(stack, b, second, shared)
        for http, pub in ((a, pub_a), (b, pub_b)):
            resp = await http.patch(f"/v1/registry/benchmarks/{pub['benchmark_id']}", json={"visibility": "public"})
            assert resp.status_code == 200
            assert (await adm.post(f"/v1/registry/impls/{pub['impl_id']}/promote")).status_code == 200
        listed = await launch(a, {"benchmark": first, "subset": shared, "model": _model(stack),
                                  "visibility": "public"})
        assert listed["off_leaderboard"] is None  # a public run on a public benchmark: it will be listed
        await wait_terminal(a, listed["id"])

        env = {"BENCHWRIGHT_API_URL": stack.api_url, "BENCHWRIGHT_API_KEY": owner, "COLUMNS": "250"}
        for ref in (f"{first}/{shared}", first, pub_a["subset_id"]):
            shown = await bw("registry", "leaderboard", ref, env=env)
            assert shown.rc == 0, (ref, shown.out, shown.err)
            assert "openai/dev" in shown.out and listed["id"] in shown.out, shown.out
        ambiguous = await bw("registry", "leaderboard", shared, env=env)
        assert ambiguous.rc == 1
        text = " ".join(ambiguous.out.split())
        assert "ambiguous_subset" in text and f"{first}/{shared} ({pub_a['subset_id']})" in text
        assert f"{second}/{shared} ({pub_b['subset_id']})" in text
        missing = await a.get("/v1/registry/subsets/no-such-thing/leaderboard")
        assert missing.status_code == 404
