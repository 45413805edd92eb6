"""Issue 9 end to end on the real stack: fingerprints, the cross-run phase cache, the registry, pinned launches with
``latest:official``, rolling subsets and the visibility matrix. Datasets come from a loopback server that counts
its downloads (listed in ``egress_internal_allowed`` like an operator's mirror)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import pytest_asyncio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from benchwright.stack.devstack import free_port
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, Stack, serve_app

pytestmark = pytest.mark.asyncio(loop_scope="session")
ROWS = (SAMPLE / "arithmetic.jsonl").read_text().splitlines(keepends=True)
CACHED = {"fetch", "analyze", "setup"}


@dataclass
class Origin:
    url: str
    downloads: dict[str, int] = field(default_factory=dict)

    def dataset(self, rows: int = 60, tag: str = "") -> str:
        """A URL serving the sample's first ``rows`` rows (``tag`` makes a URL no earlier run fetched)."""
        return f"{self.url}/{rows}/{tag or uuid.uuid4().hex[:8]}.jsonl"


@pytest_asyncio.fixture(loop_scope="session")
async def origin(stack: Stack) -> AsyncIterator[Origin]:
    served = Origin(url="")

    async def serve(request: Request) -> Response:
        served.downloads[request.url.path] = served.downloads.get(request.url.path, 0) + 1
        rows = ROWS[: int(request.path_params["rows"])]
        name = request.path_params["name"]
        if name.startswith("unique-"):  # bytes no other run of the session has: only this test's runs can share them
            rows = [json.dumps({**json.loads(r), "nonce": name}) + "\n" for r in rows]
        return Response("".join(rows), media_type="application/jsonl")

    port = free_port()
    server, task = await serve_app(Starlette(routes=[Route("/{rows:int}/{name}", serve)]), port)
    stack.settings.egress_internal_allowed.append(f"127.0.0.1:{port}")
    served.url = f"http://127.0.0.1:{port}"
    try:
        yield served
    finally:
        stack.settings.egress_internal_allowed.remove(f"127.0.0.1:{port}")
        server.should_exit = True
        await task


def _model(stack: Stack, name: str = "openai/dev") -> dict[str, Any]:
    return {"identifier": name, "api_base": stack.dev_url}


def _account(stack: Stack, *, admin: bool = False) -> str:
    engine = make_engine(stack.settings.resolved_database_url())
    try:
        return create_account(engine, name=f"reg-{uuid.uuid4().hex[:8]}", balance_usd=100.0, admin=admin)[1]
    finally:
        engine.dispose()


async def _run(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Launch, wait for the terminal event, return the final run view and its events."""
    run = await launch(http, body)
    events = await wait_terminal(http, run["id"])
    final = (await http.get(f"/v1/runs/{run['id']}")).json()
    assert final["status"] == "ok", final
    return final, events


def _hits(events: list[dict[str, Any]]) -> dict[str, str]:
    return {e["data"]["phase"]: e["data"]["source_run_id"] for e in events if e["type"] == "PhaseCacheHit"}


def _started(events: list[dict[str, Any]]) -> list[str]:
    return [e["data"]["phase"] for e in events if e["type"] == "PhaseStarted"]


async def _publish(http: httpx.AsyncClient, run_id: str, benchmark: str, subset: str = "all",
                   visibility: str = "public", **extra: Any) -> dict[str, Any]:
    resp = await http.post("/v1/registry/publish", json={"run_id": run_id, "benchmark": benchmark, "subset": subset,
                                                          "visibility": visibility, **extra})
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


async def test_fingerprint_is_stored_recomputed_and_ignores_noise(stack: Stack, origin: Origin) -> None:
    """Same data from two URLs (two ports), one run with Fetch and Atomize retried: one fingerprint. The model
    alone changes it, and only through ModelProxyArtifact."""
    async with stack.http() as http:
        a, _ = await _run(http, {"dataset": origin.dataset(), "model": _model(stack)})
        b, _ = await _run(http, {"dataset": origin.dataset(), "model": _model(stack), "metadata": {
            "fault_injection": {"phase": "atomize"}}})
        c, _ = await _run(http, {"dataset": origin.dataset(), "model": _model(stack, "openai/dev-b")})
        fa, fb, fc = [(await http.get(f"/v1/runs/{r['id']}/fingerprint")).json() for r in (a, b, c)]
    assert a["fingerprint"] == fa["fingerprint"] == fa["recomputed"] and len(a["fingerprint"]) == 12
    assert [i["type"] for i in fa["inputs"]] == ["FetchArtifact", "AnalyzeArtifact", "DatasetTasksArtifact",
                                                 "SetupArtifact", "ModelProxyArtifact", "AtomizeArtifact"]
    assert all("source" not in i["fields"] and "invocation" not in i["fields"] for i in fa["inputs"])
    assert a["fingerprint"] == b["fingerprint"] != c["fingerprint"]
    # an input's seq is where it sits in its own run's log (a first run on a fresh stack has more events before it)
    differing = [x["type"] for x, y in zip(fa["inputs"], fc["inputs"], strict=True)
                 if (x["fields"], x["canonical"]) != (y["fields"], y["canonical"])]
    assert differing == ["ModelProxyArtifact"]
    proxy = next(i["fields"] for i in fa["inputs"] if i["type"] == "ModelProxyArtifact")
    assert set(proxy) == {"model_id", "litellm_config_yaml"} and "port" not in proxy["litellm_config_yaml"]
    # the model-free family is the same across models; the run shape is null for unpublished dataset runs
    same = ("subset_fingerprint", "impl_fingerprint", "analyze_fingerprint", "setup_fingerprint")
    assert {k: fa["family"][k] for k in same} == {k: fc["family"][k] for k in same}
    assert fa["family"]["subset_fingerprint"]
    assert fa["family"]["atomize_fingerprint"] != fc["family"]["atomize_fingerprint"]  # folds in model_config_hash
    assert fa["family"]["fetch_fingerprint"] != fb["family"]["fetch_fingerprint"]  # another URL, the same bytes
    assert len(fa["family"]["impl_fingerprint"]) == 64
    assert a["benchmark_id"] is None and a["subset_id"] is None and a["impl_id"] is None


async def test_a_public_run_feeds_the_cache_and_a_private_one_never_does(stack: Stack, origin: Origin) -> None:
    # Analyze and Setup key on the dataset's bytes, not its URL: a public run of the same sample elsewhere in the
    # session would (rightly) feed this test's private runs, so its bytes are its own.
    dataset = origin.dataset(tag=f"unique-{uuid.uuid4().hex[:8]}")
    path = httpx.URL(dataset).path
    async with stack.http() as http:
        private, events = await _run(http, {"dataset": dataset, "model": _model(stack)})
        assert origin.downloads[path] == 1 and not _hits(events)
        second, events = await _run(http, {"dataset": dataset, "model": _model(stack)})
        assert origin.downloads[path] == 2 and not _hits(events), "a private run fed the cache"
        published = await _publish(http, second["id"], f"arith-{uuid.uuid4().hex[:6]}")
    async with stack.http(stack.other_key) as other:  # another account, another model
        third, events = await _run(other, {"dataset": dataset, "model": _model(stack, "openai/dev-b")})
    assert origin.downloads[path] == 2, "the cache hit downloaded the dataset again"
    assert _hits(events) == {phase: second["id"] for phase in CACHED}
    assert _started(events) == ["fetch", "analyze", "setup", "attach", "atomize", "materialize"]
    assert third["tasks"]["summary"]["passed"] == second["tasks"]["summary"]["passed"] == 60
    assert third["fingerprint"] != second["fingerprint"]
    hit = next(e["data"] for e in events if e["type"] == "PhaseCacheHit" and e["data"]["phase"] == "setup")
    assert hit["snapshot_id"] and hit["input_hash"]
    assert published["benchmark_id"] and private["id"] not in _hits(events).values()
    # the copied artifacts are the source's, so the model-free family matches
    async with stack.http() as http:
        fs = (await http.get(f"/v1/runs/{second['id']}/fingerprint")).json()["family"]
    async with stack.http(stack.other_key) as other:
        ft = (await other.get(f"/v1/runs/{third['id']}/fingerprint")).json()["family"]
    shared = ("fetch_fingerprint", "analyze_fingerprint", "setup_fingerprint", "subset_fingerprint")
    assert {k: fs[k] for k in shared} == {k: ft[k] for k in shared}
    assert fs["atomize_fingerprint"] != ft["atomize_fingerprint"]  # Atomize's key folds in the model config


SCORER_V2 = '''"""A second scorer for the same tasks: exact match after stripping, written by hand."""


class Scorer:
    def extract(self, row):
        return row["question"]

    def solve(self, row, call_sut):
        return call_sut([{"role": "user", "content": row["question"]}])

    def score(self, row, response):
        return 1.0 if str(response).strip() == str(row["answer"]).strip() else 0.0
'''


async def test_pinned_latest_official_uses_the_promoted_impls_bytes(stack: Stack, origin: Origin) -> None:
    admin = _account(stack, admin=True)
    bench = f"pin-{uuid.uuid4().hex[:6]}"
    async with stack.http() as http:
        first, _ = await _run(http, {"dataset": origin.dataset(), "model": _model(stack)})
        pub1 = await _publish(http, first["id"], bench, "test")
        resp = await http.post("/v1/runs", json={"benchmark": bench, "subset": "test", "model": _model(stack)})
        assert resp.status_code == 404 and "impl" in resp.json()["error"]["message"]
        # promotion is for admins only
        assert (await http.post(f"/v1/registry/impls/{pub1['impl_id']}/promote")).status_code == 404
    async with stack.http(admin) as adm:
        assert (await adm.post(f"/v1/registry/impls/{pub1['impl_id']}/promote")).json()["official"] is True
    async with stack.http() as http:
        pinned1, events1 = await _run(http, {"benchmark": bench, "subset": "test", "impl": "latest:official",
                                             "model": _model(stack, "openai/dev-b")})
        impl1 = (await http.get(f"/v1/registry/impls/{pub1['impl_id']}")).json()
        launched = next(e["data"]["launch"] for e in events1 if e["type"] == "RunLaunched")
        assert launched["task_impl"] == impl1["source"]  # the run really scored with the impl's exact bytes
        atomized = next(e["data"] for e in events1 if e["type"] == "AtomizeArtifact")
        assert atomized["impl_sha256"] == impl1["impl_fingerprint"]
        assert pub1["impl_id"] == f"{pub1['benchmark_id']}:{impl1['impl_fingerprint'][:12]}"
        assert (pinned1["benchmark_id"], pinned1["subset_id"], pinned1["impl_id"]) == (
            pub1["benchmark_id"], pub1["subset_id"], pub1["impl_id"])
        assert "find" not in _started(events1) and "setup" in _started(events1)
        # a newer scorer for the same subset, promoted: the next launch uses it, the old run keeps its impl
        second, _ = await _run(http, {"dataset": origin.dataset(), "model": _model(stack), "task_impl": SCORER_V2})
        pub2 = await _publish(http, second["id"], pub1["benchmark_id"], pub1["subset_id"])
        assert pub2["impl_id"] != pub1["impl_id"] and pub2["impl_id"].startswith(pub1["benchmark_id"] + ":")
    async with stack.http(admin) as adm:
        await adm.post(f"/v1/registry/impls/{pub2['impl_id']}/promote")
    async with stack.http() as http:
        pinned2, events2 = await _run(http, {"benchmark": bench, "subset": "test", "model": _model(stack)})
        launched2 = next(e["data"]["launch"] for e in events2 if e["type"] == "RunLaunched")
        assert launched2["task_impl"] == SCORER_V2 and pinned2["impl_id"] == pub2["impl_id"]
        assert (await http.get(f"/v1/runs/{pinned1['id']}")).json()["impl_id"] == pub1["impl_id"]
        # by explicit id, the first impl still launches
        explicit = await launch(http, {"benchmark": pub1["benchmark_id"], "subset": "test", "impl": pub1["impl_id"],
                                       "model": _model(stack)})
        await wait_terminal(http, explicit["id"])
        assert (await http.get(f"/v1/runs/{explicit['id']}")).json()["impl_id"] == pub1["impl_id"]


async def test_pinned_launch_errors_name_what_failed(stack: Stack, origin: Origin) -> None:
    async with stack.http() as http:
        both = await http.post("/v1/runs", json={"dataset": origin.dataset(), "benchmark": "x", "subset": "y",
                                                 "model": _model(stack)})
        assert both.status_code == 400 and both.json()["error"]["code"] == "dataset_and_benchmark"
        missing = await http.post("/v1/runs", json={"benchmark": f"nope-{uuid.uuid4().hex}", "subset": "y",
                                                    "model": _model(stack)})
        assert missing.status_code == 404 and "benchmark" in missing.json()["error"]["message"]
        run, _ = await _run(http, {"dataset": origin.dataset(), "model": _model(stack)})
        pub = await _publish(http, run["id"], f"err-{uuid.uuid4().hex[:6]}")
        no_subset = await http.post("/v1/runs", json={"benchmark": pub["benchmark_id"], "subset": "nope",
                                                      "model": _model(stack)})
        assert no_subset.status_code == 404 and "subset" in no_subset.json()["error"]["message"]
        no_impl = await http.post("/v1/runs", json={"benchmark": pub["benchmark_id"], "subset": "all",
                                                    "impl": "nope", "model": _model(stack)})
        assert no_impl.status_code == 404 and "impl" in no_impl.json()["error"]["message"]
        reserved = await http.post("/v1/runs", json={"dataset": "registry:x@1", "model": _model(stack)})
        assert reserved.status_code == 400
        public = await http.post("/v1/runs", json={"dataset": origin.dataset(), "visibility": "public",
                                                   "model": _model(stack)})
        assert public.status_code == 400 and "public benchmark" in public.json()["error"]["message"]


async def test_rolling_subset_appends_and_old_runs_reproduce(stack: Stack, origin: Origin) -> None:
    admin = _account(stack, admin=True)
    bench = f"roll-{uuid.uuid4().hex[:6]}"
    async with stack.http() as http:
        small, _ = await _run(http, {"dataset": origin.dataset(rows=40), "model": _model(stack)})
        pub = await _publish(http, small["id"], bench, "daily", rolling=True)
        assert pub["subset_version"] == 1
        async with stack.http(admin) as adm:
            await adm.post(f"/v1/registry/impls/{pub['impl_id']}/promote")
        old, _ = await _run(http, {"benchmark": bench, "subset": "daily", "model": _model(stack)})
        old_tasks = (await http.get(f"/v1/runs/{old['id']}/tasks")).json()["tasks"]
        assert old["tasks"]["summary"]["total"] == 40
        big, _ = await _run(http, {"dataset": origin.dataset(rows=60), "model": _model(stack)})
        assert (await _publish(http, big["id"], bench, "daily"))["subset_version"] == 2
        shrunk, _ = await _run(http, {"dataset": origin.dataset(rows=30), "model": _model(stack)})
        refused = await http.post("/v1/registry/publish", json={"run_id": shrunk["id"], "benchmark": bench,
                                                                "subset": "daily"})
        assert refused.status_code == 409 and "appending" in refused.json()["error"]["message"]
        new, _ = await _run(http, {"benchmark": bench, "subset": "daily", "model": _model(stack)})
        assert new["tasks"]["summary"]["total"] == 60
        again = (await http.get(f"/v1/runs/{old['id']}/fingerprint")).json()
        assert again["fingerprint"] == again["recomputed"] == old["fingerprint"] != new["fingerprint"]
        assert (await http.get(f"/v1/runs/{old['id']}/tasks")).json()["tasks"] == old_tasks
        subset = (await http.get(f"/v1/registry/subsets/{pub['subset_id']}")).json()
        assert [(s["version"], s["count"]) for s in subset["snapshots"]] == [(1, 40), (2, 60)]


READ_ROUTES = ("", "/events", "/tasks", "/tasks/0", "/blocked-hosts", "/fingerprint")


async def _reads(http: httpx.AsyncClient, run_id: str) -> dict[str, int]:
    out = {route: (await http.get(f"/v1/runs/{run_id}{route}")).status_code for route in READ_ROUTES}
    async with http.stream("GET", f"/v1/runs/{run_id}/events", headers={"Accept": "text/event-stream"}) as resp:
        out["sse"] = resp.status_code
    out["compare"] = (await http.get("/v1/compare", params={"a": run_id, "b": run_id})).status_code
    return out


async def test_visibility_matrix(stack: Stack, origin: Origin) -> None:
    """Two accounts x {private, unlisted, public} x every run-reading route, listings and the leaderboard."""
    async with stack.http() as owner, stack.http(stack.other_key) as other:
        run, _ = await _run(owner, {"dataset": origin.dataset(), "model": _model(stack)})
        rid = run["id"]
        # public needs a benchmark, and a public one
        refused = await owner.patch(f"/v1/runs/{rid}", json={"visibility": "public"})
        assert refused.status_code == 400 and "publish" in refused.json()["error"]["message"]
        pub = await _publish(owner, rid, f"vis-{uuid.uuid4().hex[:6]}", visibility="private")
        refused = await owner.patch(f"/v1/runs/{rid}", json={"visibility": "public"})
        assert refused.status_code == 400 and "private" in refused.json()["error"]["message"]
        assert (await other.get(f"/v1/registry/benchmarks/{pub['benchmark_id']}")).status_code == 404
        assert (await owner.get(f"/v1/registry/subsets/{pub['subset_id']}/leaderboard")).status_code == 404
        assert (await owner.patch(f"/v1/registry/benchmarks/{pub['benchmark_id']}",
                                  json={"visibility": "public"})).status_code == 200
        board_url = f"/v1/registry/subsets/{pub['subset_id']}/leaderboard"
        for visibility in ("private", "unlisted", "public"):
            assert (await owner.patch(f"/v1/runs/{rid}", json={"visibility": visibility})).status_code == 200
            mine, theirs = await _reads(owner, rid), await _reads(other, rid)
            assert set(mine.values()) == {200}, (visibility, mine)
            expected = 404 if visibility == "private" else 200
            assert set(theirs.values()) == {expected}, (visibility, list(theirs.items()))
            listed = [r["id"] for r in (await other.get(
                f"/v1/registry/benchmarks/{pub['benchmark_id']}")).json()["runs"]]
            board = (await other.get(board_url)).json()["rows"]
            assert (rid in listed) == (visibility == "public") == any(r["best_run_id"] == rid for r in board)
            assert rid not in [r["id"] for r in (await other.get("/v1/runs")).json()["runs"]]
            # control stays the owner's
            assert (await other.post(f"/v1/runs/{rid}/stop")).status_code == 404
            assert (await other.patch(f"/v1/runs/{rid}", json={"visibility": "private"})).status_code == 404
        row = next(r for r in (await other.get(board_url)).json()["rows"] if r["best_run_id"] == rid)
        assert row["model"] == "openai/dev" and row["pass_rate"] == 1.0 and row["runs"] >= 1
        assert row["impl_id"] == pub["impl_id"] and row["cost_usd"] >= 0
        # a private benchmark takes its runs off the leaderboard (404) and turns them unlisted
        await owner.patch(f"/v1/registry/benchmarks/{pub['benchmark_id']}", json={"visibility": "private"})
        assert (await other.get(board_url)).status_code == 404
        assert (await owner.get(f"/v1/runs/{rid}")).json()["visibility"] == "unlisted"


async def test_identicon_is_deterministic_from_the_id(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=stack.api_url) as anon:
        one = await anon.get("/v1/registry/benchmarks/bm-abc/identicon.svg")
        two = await anon.get("/v1/registry/benchmarks/bm-abc/identicon.svg")
        other = await anon.get("/v1/registry/benchmarks/bm-abd/identicon.svg")
    assert one.status_code == 200 and one.headers["content-type"].startswith("image/svg+xml")
    assert one.content == two.content != other.content and one.content.startswith(b"<svg")
