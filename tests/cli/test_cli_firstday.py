"""A newcomer's first hour from the CLI (issue 22): model identifiers without a provider, per-model endpoints in a
sweep, secrets, run-id prefixes, the sample-count flag, fork --watch, typo hints and 80-column tables. The real
`benchwright` command in a subprocess against the session stack (tests/conftest.py), real dev models on loopback,
and a real credential-proxy process."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchwright.cli.support import fitted_table, runs_table
from benchwright.client import Client
from benchwright.proxy.model_proxy import start_model_proxy, stop_owned_proxies
from benchwright.schemas import LaunchRequest
from benchwright.stack.devstack import free_port
from benchwright.stack.procreg import ProcessRegistry
from benchwright.store.db import make_engine
from benchwright.store.runs import create_run, finish_run
from benchwright.testkit.devmodel import DevModelConfig, load_answers
from tests.cli.test_cli_launch import DATASET, Done, api_env, bw
from tests.conftest import SAMPLE, DevModels, Stack

pytestmark = pytest.mark.asyncio(loop_scope="session")
KEY = "sk-firstday-" + "7" * 24
LONG_MODEL = "openai/dev-model-with-a-long-name-people-copy"


async def bw_in(*args: str, env: dict[str, str], stdin: bytes) -> Done:
    """`benchwright ARGS` with ``stdin`` piped in (as `printf %s "$KEY" | benchwright secrets set NAME`)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchwright.cli", *args, env={**os.environ, "COLUMNS": "200", **env},
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin), 120)
    assert proc.returncode is not None
    return Done(proc.returncode, out.decode(), err.decode())


async def _reference(stack: Stack, n: int = 6, model: str = "openai/dev") -> dict[str, Any]:
    """A finished run of the bundled sample's first ``n`` rows (``-n``), as the final run JSON."""
    done = await bw("run", "--dataset", DATASET, "--model", model, "--api-base", stack.dev_url, "-n", str(n),
                    "--watch", "--json", env=api_env(stack))
    assert done.rc == 0, done.err
    final: dict[str, Any] = json.loads(done.out)
    return final


async def _runs(stack: Stack) -> set[str]:
    with Client(stack.api_url, stack.api_key) as client:
        return {r["id"] for r in await asyncio.to_thread(lambda: list(client.iter_runs()))}


async def _wait(stack: Stack, run_id: str) -> dict[str, Any]:
    with Client(stack.api_url, stack.api_key) as client:
        return await asyncio.to_thread(client.wait, run_id)


# -- 1. a model identifier without a provider --------------------------------------------------------------------


async def test_a_model_without_a_provider_is_refused_at_every_door_naming_the_form(stack: Stack) -> None:
    ref = await _reference(stack)
    before = await _runs(stack)
    env = api_env(stack)
    launched = await bw("run", "--dataset", DATASET, "--model", "dev", "--api-base", stack.dev_url, env=env)
    assert launched.rc == 1 and "400 invalid_model" in launched.err, launched.err
    assert "provider/model" in launched.err and "openai/dev" in launched.err, launched.err
    assert "500" not in launched.err
    forked = await bw("fork", ref["id"], "--model", "dev", "--api-base", stack.dev_url, env=env)
    assert forked.rc == 1 and "400 invalid_model" in forked.err, forked.err
    swept = await bw("sweep", ref["id"], "--model", "openai/dev", "--model", "dev", "--api-base", stack.dev_url,
                     env=env)
    assert swept.rc == 1 and "400 invalid_model" in swept.err and "'dev'" in swept.err, swept.err
    assert await _runs(stack) == before, "a sweep with one bad model starts none of its replays"

    async with stack.http() as http:
        hostile = ["", "   ", "dev", "openai/", "/dev", "openai//dev", "openai/../../etc/passwd", "openai/./x",
                   "openai/de v", "openai/de\x00v", "openai/x\ny", "openai/\u202egpt", "openai/" + "x" * 600,
                   "ollama/llama3:8b\r\nX-Injected: 1"]
        for identifier in hostile:
            for path, body in (("/v1/runs", {"dataset": DATASET, "model": {"identifier": identifier,
                                                                          "api_base": stack.dev_url}}),
                               (f"/v1/runs/{ref['id']}/replay", {"model": identifier}),
                               (f"/v1/runs/{ref['id']}/sweep", {"models": ["openai/dev", identifier]}),
                               (f"/v1/runs/{ref['id']}/fork", {"overrides": {"model": identifier}}),
                               ("/v1/runs", {"replay_of": ref["id"], "model": identifier})):
                resp = await http.post(path, json=body)
                assert resp.status_code in (400, 422), (path, identifier, resp.status_code, resp.text)
                assert resp.json()["error"]["code"] in ("invalid_model", "validation_error"), resp.text
        good = ["openrouter/meta-llama/llama-3.1-8b-instruct", "bedrock/anthropic.claude-v2:1",
                "vertex_ai/claude-3-5-sonnet@20240620", "hosted_vllm/Qwen/Qwen2.5-0.5B-Instruct"]
        for identifier in good:  # well formed: the form check lets it through (to the driver check, here 400 other)
            resp = await http.post("/v1/runs", json={"dataset": DATASET, "driver": "no-such-driver",
                                                     "model": {"identifier": identifier, "api_base": stack.dev_url}})
            assert resp.status_code == 400 and resp.json()["error"]["code"] == "unknown_driver", resp.text
    assert await _runs(stack) == before


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[ProcessRegistry]:
    reg = ProcessRegistry(tmp_path / "data")
    yield reg
    stop_owned_proxies(reg)


async def test_the_credential_proxy_answers_a_provider_less_identifier_without_crashing(
        tmp_path: Path, dev_models: DevModels, registry: ProcessRegistry) -> None:
    """An older run may still hold ``dev``: the proxy parses it defensively (it raised IndexError on every call, which
    the run reported as 'the endpoint keeps answering HTTP 500')."""
    from benchwright.schemas import ModelSpec

    url = await dev_models.start(DevModelConfig(answers={"What is 2 + 3?": "5"}))
    handles = []
    for run_id, identifier in (("run-bare", "dev"), ("run-ok", "openai/dev")):
        run_dir = tmp_path / "runs" / run_id
        run_dir.mkdir(parents=True)
        handles.append(await asyncio.to_thread(
            start_model_proxy, run_dir=run_dir, spec=ModelSpec(identifier=identifier, api_base=url),
            secret_value=None, registry=registry, linger_s=30.0))
    bare, ok = handles
    async with httpx.AsyncClient(timeout=60) as http:
        for handle in (bare, ok):
            resp = await http.post(f"{handle.base_url}/chat/completions",
                                   headers={"Authorization": f"Bearer {handle.fake_key}"},
                                   json={"model": handle.model_name,
                                         "messages": [{"role": "user", "content": "What is 2 + 3?"}]})
            if handle is bare:
                assert 400 <= resp.status_code < 500, (resp.status_code, resp.text)
                assert resp.json()["error"]["message"], resp.text
            else:
                assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "5"
        health = await http.get(f"{bare.base_url.rsplit('/v1', 1)[0]}/health")
        assert health.status_code == 200, "the proxy is still serving"


# -- 2. sweeps with per-model endpoints and secrets, lineage labels, 80-column tables -------------------------------


async def test_a_sweep_scores_each_model_at_its_own_endpoint_and_refuses_ambiguity(
        stack: Stack, dev_models: DevModels, tmp_path: Path) -> None:
    answers = load_answers(SAMPLE / "arithmetic.jsonl")
    urls = {}
    for name, accuracy in (("m1", 1.0), ("m2", 0.0)):
        urls[name] = await dev_models.start(DevModelConfig(answers=answers, accuracy=accuracy, model_name=name,
                                                           known_models_only=True))
    urls["m3"] = await dev_models.start(DevModelConfig(answers=answers, model_name="m3", api_key=KEY,
                                                       known_models_only=True))
    servers = {name: dev_models.servers[-3 + i] for i, name in enumerate(("m1", "m2", "m3"))}
    ref = await _reference(stack, n=8)
    env = api_env(stack)
    stored = await bw_in("secrets", "set", "FIRSTDAY_M3", env=env, stdin=KEY.encode())
    assert stored.rc == 0, stored.err

    for args, words in (
            (["--model", f"openai/m1={urls['m1']}", "--api-base", urls["m2"]], "which one does each model get"),
            (["--model", "openai/m1", "--api-base", urls["m1"], "--api-base", urls["m2"]],
             "--api-base is given 2 times"),
            (["--model", f"openai/m1={urls['m1']}", "--secret", "FIRSTDAY_M3"], "one key to several endpoints"),
            (["--model", "openai/m1="], "nothing after '='"),
            ([], "name the models to sweep")):
        before = await _runs(stack)
        refused = await bw("sweep", ref["id"], *args, env=env)
        assert refused.rc == 2 and words in refused.err, (args, refused.err)
        assert await _runs(stack) == before

    models_file = tmp_path / "models.yaml"
    models_file.write_text(f"- model: openai/m2\n  api_base: {urls['m2']}\n"
                           f"- {{model: openai/m3, api_base: '{urls['m3']}', secret: FIRSTDAY_M3}}\n")
    inline = await bw("sweep", ref["id"][:8], "--model", f"openai/m1={urls['m1']}", "--json", env=env)
    from_file = await bw("sweep", ref["id"][:8], "--models", str(models_file), "--json", env=env)
    assert inline.rc == 0 and from_file.rc == 0, inline.err + from_file.err
    runs = json.loads(inline.out)["runs"] + json.loads(from_file.out)["runs"]
    assert [(r["model"]["identifier"], r["model"]["api_base"]) for r in runs] == \
        [(f"openai/{m}", urls[m]) for m in ("m1", "m2", "m3")]
    assert runs[2]["model"]["secret"] == "FIRSTDAY_M3"
    finals = {f"openai/{m}": await _wait(stack, r["id"]) for m, r in zip(("m1", "m2", "m3"), runs, strict=True)}
    rates = {m: f["tasks"]["summary"]["pass_rate"] for m, f in finals.items()}
    assert rates == {"openai/m1": 1.0, "openai/m2": 0.0, "openai/m3": 1.0}, rates
    for name, server in servers.items():  # each endpoint scored its own model: 8 tasks, keyed m3 with its key
        assert server.chat_statuses.get(200, 0) >= 8 and set(server.chat_statuses) == {200}, (name,
                                                                                              server.chat_statuses)

    lineage = json.loads((await bw("lineage", ref["id"][:8], "--json", env=env)).out)
    labels = {n["id"]: n["model"] for n in lineage["runs"]}
    assert all(labels[f["id"]] == m for m, f in finals.items()), labels

    # 80 columns: the ids and model names of compare, frontier and runs are printed whole.
    ids = [f["id"] for f in finals.values()]
    narrow = {**env, "COLUMNS": "80"}
    for args in (["compare", *ids], ["frontier", *ids], ["runs", "--limit", "4"]):
        shown = await bw(*args, env=narrow)
        assert shown.rc == 0, shown.err
        for run_id, model in zip(ids, finals, strict=True):
            if args[0] == "runs" and run_id not in shown.out:
                continue  # `runs` lists the newest four, the reference's replays among them
            assert any(run_id in line and model in line for line in shown.out.splitlines()), (args, shown.out)
    shown = await bw("runs", "--limit", "4", env=narrow)
    assert sum(run_id in shown.out for run_id in ids) >= 2, shown.out


async def test_tables_keep_ids_and_model_names_whole_at_80_columns(stack: Stack) -> None:
    final = await _reference(stack, n=3, model=LONG_MODEL)
    shown = await bw("runs", "--limit", "1", env={**api_env(stack), "COLUMNS": "80"})
    assert shown.rc == 0, shown.err
    row = next(line for line in shown.out.splitlines() if final["id"] in line)
    assert LONG_MODEL in row, shown.out
    assert shown.out.splitlines()[0].split()[:2] == ["id", "status"], "the header is one line"
    runs = [{"id": str(uuid.uuid4()), "display_status": "ok", "model": "openrouter/" + "m" * 60, "phase": None,
             "tasks": {"summary": {"total": 3, "passed": 3, "failed": 0, "errored": 0, "pass_rate": 1.0}},
             "cost": {"incurred": 0.0}, "created_at": "2026-12-01T00:00:00"}]
    from rich.console import Console

    console = Console(width=80, soft_wrap=True, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(runs_table(runs, width=80))
    text = console.export_text()
    assert runs[0]["id"] in text and runs[0]["model"] in text, "wider than the terminal rather than cut"
    boxed = fitted_table(["model", "pass rate", "runs", "impl", "cost $", "best run"],
                         [[LONG_MODEL, "100.0%", "3", str(uuid.uuid4()), "0.0000", str(uuid.uuid4())]],
                         whole=("model", "best run", "impl"), drop=("cost $", "runs"), width=80)
    console.print(boxed, crop=False)
    assert [c.header for c in boxed.columns] == ["model", "pass rate", "impl", "best run"], "dropped before cut"


# -- 3. secrets from the CLI ------------------------------------------------------------------------------------------


async def test_secrets_from_the_cli_key_a_run_and_are_never_shown(stack: Stack, dev_models: DevModels) -> None:
    url = await dev_models.start(DevModelConfig(answers=load_answers(SAMPLE / "arithmetic.jsonl"), api_key=KEY))
    env = api_env(stack)
    name = f"FIRSTDAY_{uuid.uuid4().hex[:6].upper()}"
    stored = await bw_in("secrets", "set", name, "--host", "127.0.0.1", env=env, stdin=(KEY + "\n").encode())
    assert stored.rc == 0 and name in stored.out and f"--secret {name}" in stored.out, stored.err
    from_env = await bw("secrets", "set", name + "_ENV", "--from-env", "FIRSTDAY_VALUE",
                        env={**env, "FIRSTDAY_VALUE": KEY})
    missing = await bw("secrets", "set", name + "_X", "--from-env", "FIRSTDAY_UNSET", env=env)
    empty = await bw_in("secrets", "set", name + "_X", env=env, stdin=b"")
    assert from_env.rc == 0 and missing.rc == 2 and empty.rc == 2, from_env.err + missing.err + empty.err
    assert "FIRSTDAY_UNSET" in missing.err and "empty" in empty.err
    listed = await bw("secrets", "list", env=env)
    listed_json = json.loads((await bw("secrets", "list", "--json", env=env)).out)
    assert listed.rc == 0 and name in listed.out and "127.0.0.1" in listed.out, listed.out
    mine = {s["name"]: s for s in listed_json}
    assert mine[name]["host_pattern"] == "127.0.0.1" and "value" not in mine[name]

    keyed = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "--api-base", url, "--secret", name,
                     "-n", "5", "--watch", env=env)
    assert keyed.rc == 0 and "passed 5, failed 0, errored 0 of 5" in keyed.out, keyed.out + keyed.err
    keyed_env = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "--api-base", url, "--secret",
                         name + "_ENV", "-n", "2", "--watch", env=env)
    assert keyed_env.rc == 0, keyed_env.out + keyed_env.err
    unkeyed = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "--api-base", url, "-n", "2", "--watch",
                       env=env)
    assert unkeyed.rc == 1, "without the secret the endpoint refuses the run"

    removed = await bw("secrets", "rm", name, env=env)
    assert removed.rc == 0 and f"deleted secret {name}" in removed.out
    assert name not in {s["name"] for s in json.loads((await bw("secrets", "list", "--json", env=env)).out)}
    gone = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "--api-base", url, "--secret", name,
                    env=env)
    assert gone.rc == 1 and name in gone.err, gone.err
    hostile = await bw("secrets", "rm", "../runs", env=env)
    assert hostile.rc == 2 and "not a secret name" in hostile.err
    for done in (stored, from_env, missing, empty, listed, keyed, keyed_env, unkeyed, removed, gone, hostile):
        assert KEY not in done.out + done.err, "a secret's value is never printed"


# -- 4. run-id prefixes -----------------------------------------------------------------------------------------------


def _row(engine: Any, account_id: str, run_id: str, visibility: str = "private") -> None:
    launch = LaunchRequest.model_validate({"dataset": DATASET, "model": "openai/dev", "visibility": visibility})
    create_run(engine, account_id=account_id, launch=launch, driver="builtin", trials_config={}, run_id=run_id)
    finish_run(engine, run_id=run_id, status="error", error="a row made by the prefix test")


async def test_commands_take_a_unique_run_id_prefix_over_the_callers_own_runs(stack: Stack) -> None:
    ref = await _reference(stack, n=4)
    env = api_env(stack)
    short = ref["id"][:8]
    for args in (["show", short], ["tasks", short], ["events", short], ["lineage", short],
                 ["show", ref["id"][:4].upper()]):
        done = await bw(*args, env=env)
        assert done.rc == 0, (args, done.err)
    assert f"run {ref['id']}" in (await bw("show", short, env=env)).out
    assert len(json.loads((await bw("tasks", short, "--json", env=env)).out)) == 4

    forked = await bw("fork", short, "--rewind-to", "materialize", "--watch", env=env)
    assert forked.rc == 0, forked.err
    assert "tasks/s" in forked.err and "ETA" in forked.err, "the same progress as run --watch"
    assert f"of {short} launched" in forked.err and "passed 4, failed 0, errored 0 of 4" in forked.out, forked.out

    published = await bw("registry", "publish", short, "--benchmark", f"firstday-{uuid.uuid4().hex[:6]}",
                         "--subset", "s1", env=env)
    assert published.rc == 0 and f"published run {ref['id']}" in published.out, published.out + published.err
    scheduled = await bw("schedule", "create", short, "--every", "1d", env=env)
    assert scheduled.rc == 0 and f"replays {ref['id']}" in scheduled.out, scheduled.err
    assert (await bw("schedule", "delete", scheduled.out.split()[0], env=env)).rc == 0

    # Ambiguous and cross-account prefixes, on rows made directly in the store.
    async with stack.http() as http:
        me = (await http.get("/v1/account")).json()["id"]
    async with stack.http(stack.other_key) as http:
        other = (await http.get("/v1/account")).json()["id"]
    prefix = uuid.uuid4().hex[:6]
    twins = [f"{prefix}{d}{d}-0000-4000-8000-{uuid.uuid4().hex[:12]}" for d in "01"]
    theirs = f"{prefix}22-0000-4000-8000-{uuid.uuid4().hex[:12]}"
    public = f"{prefix}33-0000-4000-8000-{uuid.uuid4().hex[:12]}"
    engine = make_engine(stack.settings.resolved_database_url())
    try:
        for run_id in twins:
            await asyncio.to_thread(_row, engine, me, run_id)
        await asyncio.to_thread(_row, engine, other, theirs)
        await asyncio.to_thread(_row, engine, other, public, "public")
    finally:
        engine.dispose()
    ambiguous = await bw("show", prefix, env=env)
    assert ambiguous.rc == 1 and "409 ambiguous_run_id" in ambiguous.err, ambiguous.err
    assert all(t in ambiguous.err for t in twins) and theirs not in ambiguous.err and public not in ambiguous.err
    one = await bw("show", twins[1][:8], env=env)
    assert one.rc == 0 and f"run {twins[1]}" in one.out, one.err
    for hidden in (theirs, public):  # another account's run: never by prefix, however visible
        leak = await bw("show", hidden[:8], env=env)
        assert leak.rc == 1 and "404" in leak.err and hidden not in leak.err, leak.err
    assert (await bw("show", public, env=env)).rc == 0, "a public run is still read by its full id"
    assert (await bw("show", theirs[:8], env=api_env(stack, stack.other_key))).rc == 0, "its owner's prefix works"
    for bad in ("zzzzzzzz", "abc", "../../v1/account"):
        refused = await bw("show", bad, env=env)
        assert refused.rc == 1 and "404" in refused.err, (bad, refused.err)
    async with stack.http() as http:
        for bad in ("abc", "ZZZZ", "%", "a" * 37):
            assert (await http.get("/v1/runs", params={"id_prefix": bad})).status_code == 422, bad


# -- 5-7. sample count, --limit N, typo hints --------------------------------------------------------------------------


async def test_max_tasks_is_the_sample_count_and_a_bare_limit_points_to_it(stack: Stack) -> None:
    final = await _reference(stack, n=7)
    assert final["tasks"]["summary"]["total"] == 7 and final["limits"]["max_tasks"] == 7
    env = api_env(stack)
    long_form = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "--api-base", stack.dev_url,
                         "--max-tasks", "3", "--json", "--watch", env=env)
    assert long_form.rc == 0 and json.loads(long_form.out)["tasks"]["summary"]["total"] == 3, long_form.err
    bare = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "--limit", "10", env=env)
    assert bare.rc == 2 and "--max-tasks N (or -n N)" in bare.err and "--limit takes KEY=VALUE" in bare.err, bare.err
    clash = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "-n", "5", "--constraints", "max_tasks=6",
                     env=env)
    assert clash.rc == 2 and "disagree" in clash.err
    zero = await bw("run", "--dataset", DATASET, "--model", "openai/dev", "-n", "0", env=env)
    assert zero.rc == 2, zero.err


async def test_a_typo_is_never_answered_with_a_retired_flag() -> None:
    nowhere = {"BENCHWRIGHT_API_URL": f"http://127.0.0.1:{free_port()}", "BENCHWRIGHT_API_KEY": "bw_x"}
    for typo, meant in (("--datset", "--dataset"), ("--agnt", None), ("--operater", None), ("--drivr", "--driver")):
        done = await bw("run", "--model", "openai/dev", typo, "x", env=nowhere)
        assert done.rc == 2 and "No such option" in done.err, done.err
        assert "--agent" not in done.err and "--operator" not in done.err, (typo, done.err)
        if meant:
            assert meant in done.err, (typo, done.err)
