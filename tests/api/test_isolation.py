"""Sandboxes, the model proxy and the host policy through real launches (§4, §11): a hostile scorer gets nowhere,
the real key lives only in the credential proxy and a run's key dies with the run, two accounts' runs stay apart,
egress obeys the account's policy, fanout equals sequential, and snapshots restore the same filesystem."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from benchwright.proxy.model_proxy import ProxyHandle, load_handle
from benchwright.sandbox import LocalBackend
from benchwright.stack.devstack import free_port
from benchwright.testkit.devmodel import DevModelConfig, load_answers
from tests.api.helpers import launch, wait_terminal
from tests.api.test_scale import _live_sandboxes
from tests.conftest import SAMPLE, DevModels, Stack, serve_app

pytestmark = pytest.mark.asyncio(loop_scope="session")
DATASET = str(SAMPLE / "arithmetic.jsonl")
REAL_KEY = "sk-real-provider-key-" + "7" * 24

HOSTILE_IMPL = r'''
import glob, json, os, socket, subprocess, sys, time, urllib.request

REAL_KEY = "".join(reversed(%(reversed_key)r))  # not spelled out, so the launch body does not carry it
DATA_DIR = %(data_dir)r
HOST_PORTS = %(host_ports)r
TEST_SECRET = %(test_secret)r
ENDED_RUN_KEY = %(ended_run_key)r


def _env_leak():
    seen = json.dumps(dict(os.environ))
    for path in glob.glob("/proc/*/environ"):
        try:
            seen += open(path, "rb").read().decode(errors="replace")
        except OSError:
            pass
    return REAL_KEY in seen or TEST_SECRET in seen


def _read_host_files():
    got = []
    for path in [os.path.join(DATA_DIR, "benchwright.db"), "/root/.bashrc", "/etc/shadow",
                 os.path.join(DATA_DIR, "runs"), os.path.join(DATA_DIR, "deployment.key")]:
        try:
            if os.path.isdir(path):
                got.append(path + ":" + ",".join(os.listdir(path)))
            else:
                open(path, "rb").read(16)
                got.append(path)
        except OSError:
            pass
    return got


def _connect_direct():
    reached = []
    for port in HOST_PORTS:
        s = socket.socket()
        s.settimeout(1)
        try:
            s.connect(("127.0.0.1", port))
            reached.append(port)
        except OSError:
            pass
        finally:
            s.close()
    return reached


def _fork_bomb():
    import signal
    bomb = subprocess.Popen([sys.executable, "-c",
                             "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"],
                            start_new_session=True)
    time.sleep(2)
    contained = bomb.poll() is None  # still running, still contained: it did not take the sandbox (or host) down
    for _ in range(50):  # then defuse it, so the rest of the suite does not share two cores with it
        try:
            os.killpg(bomb.pid, signal.SIGKILL)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    return contained


def _memory():
    grab = "chunks = []\nfor _ in range(96):\n    chunks.append(bytearray(b'x' * (64 << 20)))\nprint(len(chunks))"
    proc = subprocess.run([sys.executable, "-c", grab], capture_output=True)  # 6 GiB, every page touched
    return proc.returncode != 0


def _print_gigabytes():
    chunk = "x" * (1 << 20)
    for _ in range(1024):
        sys.stdout.write(chunk)
    sys.stdout.flush()
    return True


def _proxy_keys():
    base, fake = os.environ.get("OPENAI_BASE_URL"), os.environ.get("OPENAI_API_KEY")
    if not base or fake == REAL_KEY:
        return "no proxy or real key in env"
    body = json.dumps({"model": %(model)r, "messages": [{"role": "user", "content": %(question)r}]}).encode()
    out = []
    for key in (fake, "sk-guessed", REAL_KEY, ENDED_RUN_KEY):
        req = urllib.request.Request(base + "/chat/completions", data=body, headers={
            "Authorization": "Bearer " + key, "Content-Type": "application/json"})
        try:
            out.append(urllib.request.urlopen(req, timeout=30).status)
        except urllib.error.HTTPError as exc:
            out.append(exc.code)
        except Exception as exc:
            out.append(type(exc).__name__)
    return out


class Scorer:
    def extract(self, row):
        return row["question"]

    def solve(self, row, call_sut):
        probe = row["probe"]
        if probe == "sut":
            return call_sut(self.extract(row))
        result = {
            "env": _env_leak, "files": _read_host_files, "sockets": _connect_direct, "fork": _fork_bomb,
            "memory": _memory, "print": _print_gigabytes, "proxy": _proxy_keys,
        }[probe]()
        return json.dumps(result)

    def score(self, row, response):
        return 1.0 if response.strip() == row["answer"] else 0.0
'''


async def _poll_events_for(http: httpx.AsyncClient, run_id: str, event_type: str, timeout_s: float = 60) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        events = (await http.get(f"/v1/runs/{run_id}/events", params={"limit": 5000})).json()["events"]
        found = [e for e in events if e["type"] == event_type]
        if found:
            return found[0]
        assert asyncio.get_running_loop().time() < deadline, f"no {event_type}"
        await asyncio.sleep(0.1)


async def _handle_of(stack: Stack, run_id: str) -> ProxyHandle:
    """The run's route at the credential proxy, once Attach registered it."""
    deadline = asyncio.get_running_loop().time() + 120
    while (handle := load_handle(stack.data_dir / "runs" / run_id)) is None:
        assert asyncio.get_running_loop().time() < deadline, "no route registered"
        await asyncio.sleep(0.05)
    return handle


async def _key_status(handle: ProxyHandle, key: str, model: str = "openai/dev") -> int:
    """What the credential proxy answers a chat call with ``key``."""
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(f"{handle.base_url}/chat/completions", headers={"Authorization": f"Bearer {key}"},
                               json={"model": model, "messages": [{"role": "user", "content": "What is 2 + 3?"}]})
    return resp.status_code


async def test_hostile_scorer_gets_nowhere_and_the_real_key_lives_only_in_the_proxy(
        stack: Stack, dev_models: DevModels, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    test_secret = "worker-only-secret-" + "9" * 16
    monkeypatch.setenv("BENCHWRIGHT_TEST_SECRET", test_secret)  # in the worker's (this process's) environment
    answers = load_answers(SAMPLE / "arithmetic.jsonl")
    keyed_url = await dev_models.start(DevModelConfig(answers=answers, api_key=REAL_KEY))
    question = next(iter(answers))
    api_port = int(stack.api_url.rsplit(":", 1)[1])
    model_port = int(keyed_url.split(":")[2].split("/")[0])
    model = {"identifier": "openai/dev", "api_base": keyed_url, "secret": "DEVKEY", "input_cost_per_token": 1e-6,
             "output_cost_per_token": 1e-6}
    async with stack.http() as http:
        made = await http.post("/v1/secrets", json={"name": "DEVKEY", "value": REAL_KEY})
        assert made.status_code == 201
        # An earlier run of the same account: its per-run key, dead once it ended, is what the scorer tries too.
        earlier = await launch(http, {"dataset": DATASET, "model": model})
        ended_key = (await _handle_of(stack, earlier["id"])).fake_key
        await wait_terminal(http, earlier["id"])
        await stack.client.get_workflow_handle(earlier["id"]).result()
        impl = HOSTILE_IMPL % {"reversed_key": REAL_KEY[::-1], "data_dir": str(stack.data_dir),
                               "test_secret": test_secret, "host_ports": [api_port, model_port, 5432],
                               "model": "openai/dev", "question": question, "ended_run_key": ended_key}
        expect = {"sut": answers[question], "env": "false", "files": "[]", "sockets": "[]", "fork": "true",
                  "memory": "true", "print": "true", "proxy": "[200, 401, 401, 401]"}
        dataset = tmp_path / "hostile.jsonl"
        dataset.write_text("".join(json.dumps({"probe": p, "question": question, "answer": a}) + "\n"
                                   for p, a in expect.items()))
        # The 6 GiB probe meets the sandbox's memory ceiling in ~5 s on a quiet machine, past the test stack's 10 s
        # attempt limit at a load average of 7: this test is about isolation, not that limit.
        run = await launch(http, {"dataset": str(dataset), "task_impl": impl, "model": model,
                                  "limits": {"attempt": {"duration": 120}}})
        handle = await _handle_of(stack, run["id"])
        proxy_env = Path(f"/proc/{handle.pid}/environ").read_bytes() + Path(f"/proc/{handle.pid}/cmdline").read_bytes()
        events = await wait_terminal(http, run["id"])
        tasks = (await http.get(f"/v1/runs/{run['id']}/tasks")).json()["tasks"]
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        await stack.client.get_workflow_handle(run["id"]).result()  # the route's revocation
        after = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 5000})).json()["events"]
        listed = [(await http.get(path)).json() for path in ("/v1/runs", "/v1/secrets", "/v1/account")]
        api_seen = json.dumps([final, tasks, *listed])

    # The dev model answers only REAL_KEY, so every passing call proves the proxy put it on the request; it got
    # the key over its control socket: not in its environment or arguments, not in the worker's environment.
    assert REAL_KEY.encode() not in proxy_env and REAL_KEY.encode() not in Path("/proc/self/environ").read_bytes()
    by_probe = {json.loads(line)["probe"]: t for line, t in zip(dataset.read_text().splitlines(), tasks, strict=True)}
    outputs = {probe: (t["outcome"], t["output"]) for probe, t in by_probe.items()}
    assert all(t["outcome"] == "pass" for t in tasks), outputs
    assert final["status"] == "ok" and final["isolation"] == "namespaces"
    assert final["cost"]["model"] > 0, "the proxy's reported cost is cost.model"
    logged = json.dumps(after)
    assert REAL_KEY not in logged and handle.fake_key not in logged, "no key in any event"
    assert REAL_KEY not in api_seen and handle.fake_key not in api_seen, "no key in any answer of the API"
    assert REAL_KEY not in (stack.data_dir / "credential-proxy.log").read_text(errors="replace")
    proxy_sandbox = [e["data"] for e in after if e["type"].startswith("Sandbox") and e["data"]["role"] == "proxy"]
    assert [e["sandbox_id"] for e in proxy_sandbox] == [f"proxy-{handle.pid}-{run['id']}"] * 2
    assert any(e["type"] == "ProxyLingerMetered" for e in after)
    assert load_handle(stack.data_dir / "runs" / run["id"]) is None
    assert await _key_status(handle, handle.fake_key) == 401, "the run's key died with the run"
    assert await _live_sandboxes(stack, run["id"]) == []
    roles = Counter(e["data"]["role"] for e in events if e["type"] == "SandboxCreated")
    assert roles["work"] >= 2 and roles["proxy"] == 1  # atomize, materialize (fetch and setup ran nothing)
    async with stack.http() as http:
        assert (await http.delete("/v1/secrets/DEVKEY")).status_code == 204


@pytest_asyncio.fixture(loop_scope="session")
async def origin() -> AsyncIterator[int]:
    app = Starlette(routes=[Route("/{path:path}", lambda _: PlainTextResponse("origin says hello"))])
    port = free_port()
    server, task = await serve_app(app, port)
    yield port
    server.should_exit = True
    await task


POLICY_IMPL = r'''
import json, urllib.request

class Scorer:
    def extract(self, row):
        return row["url"]

    def solve(self, row, call_sut):
        try:
            with urllib.request.urlopen(row["url"], timeout=10) as resp:
                return "reached: " + resp.read().decode()
        except urllib.error.HTTPError as exc:
            return "refused %%d %%s" %% (exc.code, exc.headers.get("X-Benchwright-Blocked"))
        except Exception as exc:
            return "failed " + type(exc).__name__

    def score(self, row, response):
        return 1.0 if response.startswith(row["expect"]) else 0.0
'''


async def test_host_policy_allows_blocks_and_logs_every_refusal(stack: Stack, origin: int, tmp_path: Path) -> None:
    stack.settings.egress_internal_allowed.append(f"127.0.0.1:{origin}")  # an operator-allowed internal mirror
    rows = [{"url": f"http://localhost:{origin}/hello", "expect": "reached: origin says hello", "answer": "x"},
            {"url": f"http://127.0.0.1:{origin}/hello", "expect": "refused 403 127.0.0.1", "answer": "x"},
            {"url": "http://blocked.example/", "expect": "refused 403 blocked.example", "answer": "x"}]
    dataset = tmp_path / "urls.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    body = {"dataset": str(dataset), "task_impl": POLICY_IMPL % (),
            "model": {"identifier": "openai/dev", "api_base": stack.dev_url}}
    model_rule = stack.dev_url.split("//", 1)[1].split("/", 1)[0]  # 127.0.0.1:<port>
    try:
        async with stack.http(stack.other_key) as http:
            assert (await http.put("/v1/host-policy/default", json={"default": "block"})).status_code == 200
            assert (await http.post("/v1/host-policy/rules", json={"pattern": "localhost", "action": "allow"})
                    ).status_code == 201
            # The model's endpoint is held to the policy too (benchwright.llm.model_access): allowed by its own rule.
            assert (await http.post("/v1/host-policy/rules", json={"pattern": model_rule, "action": "allow"})
                    ).status_code == 201
            # The account-wide log already holds what other tests of this account were refused: count from here.
            before = {h["host"]: h["seen_count"] for h in (await http.get("/v1/blocked-hosts")).json()["hosts"]}
            first = await launch(http, body)
            await wait_terminal(http, first["id"])
            tasks = (await http.get(f"/v1/runs/{first['id']}/tasks")).json()["tasks"]
            assert [t["outcome"] for t in tasks] == ["pass", "pass", "pass"], [t["output"] for t in tasks]
            once = (await http.get(f"/v1/runs/{first['id']}/blocked-hosts")).json()["hosts"]
            second = await launch(http, body)
            await wait_terminal(http, second["id"])
            total = (await http.get("/v1/blocked-hosts")).json()["hosts"]
    finally:
        stack.settings.egress_internal_allowed.remove(f"127.0.0.1:{origin}")
        async with stack.http(stack.other_key) as http:
            await http.put("/v1/host-policy/default", json={"default": "allow"})
            await http.delete("/v1/host-policy/rules/localhost")
            await http.delete(f"/v1/host-policy/rules/{model_rule}")
    assert {h["host"]: h["seen_count"] for h in once} == {"127.0.0.1": 1, "blocked.example": 1}
    grown = {h["host"]: h["seen_count"] - before.get(h["host"], 0) for h in total}
    assert {host: n for host, n in grown.items() if n} == {"127.0.0.1": 2, "blocked.example": 2}
    assert all(h["last_seen"] >= h["first_seen"] for h in total)


async def test_requirements_install_through_the_policy(stack: Stack) -> None:
    async with stack.http(stack.other_key) as http:
        await http.put("/v1/host-policy/default", json={"default": "block"})
        try:
            run = await launch(http, {"dataset": DATASET, "requirements": ["six==1.16.0"],
                                      "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
            events = await wait_terminal(http, run["id"])
            hosts = (await http.get(f"/v1/runs/{run['id']}/blocked-hosts")).json()["hosts"]
        finally:
            await http.put("/v1/host-policy/default", json={"default": "allow"})
    failed = [e["data"] for e in events if e["type"] == "PhaseFailed"]
    assert failed and failed[0]["phase"] == "setup" and failed[0]["error_type"] == "RequirementsFailed"
    assert "six==1.16.0" in failed[0]["detail"]
    assert hosts and all(h["seen_count"] >= 1 for h in hosts), "pip's index host landed in the blocked-host log"


async def test_fanout_and_sequential_score_the_same(stack: Stack, dev_models: DevModels) -> None:
    url = await dev_models.start(DevModelConfig(answers=load_answers(SAMPLE / "arithmetic.jsonl"), accuracy=0.6))
    body = {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": url}}
    async with stack.http() as http:
        sequential = await launch(http, body)
        stack.settings.local_materialize_mode = "fanout"
        try:
            fanout = await launch(http, body)
        finally:
            stack.settings.local_materialize_mode = "sequential"
        seq_events = await wait_terminal(http, sequential["id"])
        fan_events = await wait_terminal(http, fanout["id"])
        seq_tasks = (await http.get(f"/v1/runs/{sequential['id']}/tasks")).json()["tasks"]
        fan_tasks = (await http.get(f"/v1/runs/{fanout['id']}/tasks")).json()["tasks"]
        modes = [(await http.get(f"/v1/runs/{r['id']}")).json()["materialize_mode"] for r in (sequential, fanout)]
    assert modes == ["sequential", "fanout"]
    assert [(t["index"], t["score"]) for t in seq_tasks] == [(t["index"], t["score"]) for t in fan_tasks]
    assert 0 < sum(t["score"] for t in seq_tasks) < 60
    created = {e["data"]["sandbox_id"]: e["data"]["metadata"]["task_index"]
               for e in fan_events if e["type"] == "SandboxCreated" and e["data"]["role"] == "task"}
    killed = [e["data"]["sandbox_id"] for e in fan_events
              if e["type"] == "SandboxKilled" and e["data"]["role"] == "task"]
    assert sorted(created.values()) == list(range(60)) or set(created.values()) == set(range(60)), \
        "every task ran in a task sandbox of its own (a retried batch may give a task a second one)"
    assert sorted(created) == sorted(killed), "every task sandbox was killed"
    assert not any(e["type"] == "SandboxCreated" and e["data"]["role"] == "task" for e in seq_events)


async def test_snapshots_restore_the_same_filesystem(stack: Stack) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        events = await wait_terminal(http, run["id"])
    snaps = {e["data"]["phase"]: e["data"]["snapshot_id"] for e in events if e["type"] == "SnapshotCreated"}
    assert set(snaps) == {"fetch", "setup", "atomize"}
    impl = (stack.data_dir / "runs" / run["id"] / "work" / "task_impl.py").read_bytes()
    backend = LocalBackend(stack.settings.sandboxes_dir())  # a fresh backend: everything it needs is on disk
    info = await backend.create(role="work", run_id="restore-check", snapshot_id=snaps["atomize"])
    try:
        assert await backend.read_file(info.sandbox_id, "task_impl.py") == impl
        assert await backend.read_file(info.sandbox_id, "dataset.jsonl") == (SAMPLE / "arithmetic.jsonl").read_bytes()
        again = await backend.snapshot(info.sandbox_id, label="same content")
        assert again == snaps["atomize"], "identical content, identical content-addressed snapshot"
    finally:
        await backend.kill(info.sandbox_id)
        await backend.close()


async def test_a_keyless_run_goes_through_the_proxy_too(stack: Stack) -> None:
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {
            "identifier": "openai/dev", "api_base": stack.dev_url, "input_cost_per_token": 2e-6,
            "output_cost_per_token": 2e-6}})
        await wait_terminal(http, run["id"])
        await stack.client.get_workflow_handle(run["id"]).result()  # the route's revocation
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        events = (await http.get(f"/v1/runs/{run['id']}/events", params={"limit": 5000})).json()["events"]
    assert final["status"] == "ok" and final["tasks"]["summary"]["pass_rate"] == 1.0
    assert [e["data"]["role"] for e in events if e["type"] == "SandboxCreated"].count("proxy") == 1
    results = [e["data"] for e in events if e["type"] == "MaterializeTaskResult"]
    reported = sum(r["cost_usd"] for r in results)
    assert reported == pytest.approx(sum(2e-6 * r["usage"]["total_tokens"] for r in results))
    assert final["cost"]["model"] == pytest.approx(reported)
    assert any(e["type"] == "ProxyLingerMetered" for e in events)
    assert load_handle(stack.data_dir / "runs" / run["id"]) is None, "the route was revoked at the run's end"


async def test_cost_model_is_litellms_price_for_the_recorded_tokens(stack: Stack, dev_models: DevModels) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    url = await dev_models.start(DevModelConfig(answers=load_answers(SAMPLE / "arithmetic.jsonl"),
                                                model_name="gpt-4o-mini"))
    async with stack.http() as http:
        run = await launch(http, {"dataset": DATASET, "model": {"identifier": "openai/gpt-4o-mini", "api_base": url}})
        events = await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
    results = [e["data"] for e in events if e["type"] == "MaterializeTaskResult"]
    priced = [sum(litellm.cost_per_token(model="gpt-4o-mini", prompt_tokens=r["usage"]["prompt_tokens"],
                                         completion_tokens=r["usage"]["completion_tokens"])) for r in results]
    assert final["status"] == "ok" and len(results) == 60 and all(p > 0 for p in priced)
    assert [r["cost_usd"] for r in results] == pytest.approx(priced)
    assert final["cost"]["model"] == pytest.approx(sum(priced))


SLOW_IMPL = r'''
import time

class Scorer:
    def extract(self, row):
        return row["question"]

    def solve(self, row, call_sut):
        reply = call_sut(self.extract(row))
        time.sleep(0.5)
        return reply

    def score(self, row, response):
        return 1.0 if response.strip() == row["answer"] else 0.0
'''


async def test_two_accounts_concurrent_keyed_runs_stay_apart_and_their_keys_die_with_them(
        stack: Stack, dev_models: DevModels) -> None:
    answers = load_answers(SAMPLE / "arithmetic.jsonl")
    keys = {"main": "sk-real-main-" + "3" * 24, "other": "sk-real-other-" + "4" * 24}
    urls = {who: await dev_models.start(DevModelConfig(answers=answers, api_key=key)) for who, key in keys.items()}
    prices = {"main": 1e-6, "other": 5e-6}
    runs: dict[str, dict[str, Any]] = {}
    handles: dict[str, ProxyHandle] = {}
    for who, api_key in (("main", stack.api_key), ("other", stack.other_key)):
        async with stack.http(api_key) as http:
            # The same secret name in both accounts: each run must get its own account's value.
            assert (await http.post("/v1/secrets", json={"name": "SHARED", "value": keys[who]})).status_code == 201
            runs[who] = await launch(http, {"dataset": DATASET, "task_impl": SLOW_IMPL, "concurrency": 4, "model": {
                "identifier": "openai/dev", "api_base": urls[who], "secret": "SHARED",
                "input_cost_per_token": prices[who], "output_cost_per_token": prices[who]}})
    for who in runs:
        handles[who] = await _handle_of(stack, runs[who]["id"])
    # While both run: one proxy, two routes; neither key reaches the other's model (or the other's name).
    assert handles["main"].pid == handles["other"].pid and handles["main"].fake_key != handles["other"].fake_key
    assert await _key_status(handles["main"], handles["main"].fake_key) == 200
    async with stack.http(stack.other_key) as http:  # stop the other account's run once it has scored a task
        await _poll_events_for(http, runs["other"]["id"], "MaterializeTaskResult")
        stopped = await http.post(f"/v1/runs/{runs['other']['id']}/stop", json={"reason": "enough"})
        assert stopped.status_code < 300, stopped.text
    finals, logs = {}, {}
    for who, api_key in (("main", stack.api_key), ("other", stack.other_key)):
        async with stack.http(api_key) as http:
            await wait_terminal(http, runs[who]["id"])
            await stack.client.get_workflow_handle(runs[who]["id"]).result()
            finals[who] = (await http.get(f"/v1/runs/{runs[who]['id']}")).json()
            logs[who] = (await http.get(f"/v1/runs/{runs[who]['id']}/events", params={"limit": 5000})).json()["events"]
            assert (await http.delete("/v1/secrets/SHARED")).status_code == 204
    assert finals["main"]["status"] == "ok" and finals["main"]["tasks"]["summary"]["pass_rate"] == 1.0
    assert finals["other"]["halted"] and finals["other"]["halt_reason"].startswith("operator_kill")
    for who in runs:
        results = [e["data"] for e in logs[who] if e["type"] == "MaterializeTaskResult"]
        assert results and all(r["outcome"] != "error" for r in results), "each run's calls carried its own key"
        expected = sum(prices[who] * (r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]) for r in results)
        assert finals[who]["cost"]["model"] == pytest.approx(expected), "each run's spend at its own prices"
        seen = json.dumps(logs[who])
        assert not any(k in seen for k in keys.values()) and handles["main"].fake_key not in seen
        assert handles["other"].fake_key not in seen
        assert await _key_status(handles[who], handles[who].fake_key) == 401, "revoked at the end (and the stop)"
