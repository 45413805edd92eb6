"""Scheduled regression runs on the real Temporal dev server (issue 17): a schedule firing every 2 s replays a
reference run; the dev model dropping from 0.9 to 0.5 accuracy between firings raises RegressionDetected exactly
once (later firings say "ongoing"), and a loopback webhook on the operator's allow-list receives it once."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from benchwright.stack.devstack import free_port
from benchwright.testkit.devmodel import DevModelConfig, start_server
from tests.api.helpers import launch, wait_terminal
from tests.conftest import DevModels, Stack, serve_app

pytestmark = pytest.mark.asyncio(loop_scope="session")
N = 400
DEADLINE_S = 90.0


def _dataset(path: Path) -> dict[str, str]:
    answers = {}
    with path.open("w") as f:
        for i in range(N):
            q = f"What is {i} minus 4? (row {i})"
            answers[q] = str(i - 4)
            f.write(json.dumps({"question": q, "answer": answers[q]}) + "\n")
    return answers


async def _until(http: httpx.AsyncClient, schedule_id: str, done: Any, what: str) -> dict[str, Any]:
    """Poll the schedule until ``done(view)`` holds (a deadline, not a sleep, decides failure)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        resp = await http.get(f"/v1/schedules/{schedule_id}")
        assert resp.status_code == 200, resp.text
        view: dict[str, Any] = resp.json()
        if done(view):
            return view
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {view['firings']}"
        await asyncio.sleep(0.25)


def _completed(view: dict[str, Any]) -> list[dict[str, Any]]:
    return [f["result"] for f in view["firings"] if f["status"] == "COMPLETED"]


async def test_a_drop_between_firings_alerts_once(stack: Stack, dev_models: DevModels, tmp_path: Path) -> None:
    answers = _dataset(tmp_path / "regress.jsonl")
    model_port = free_port()
    good = await start_server(DevModelConfig(answers=answers, accuracy=0.9), port=model_port)
    dev_models.servers.append(good)
    received: list[dict[str, Any]] = []

    async def hook(request: Request) -> JSONResponse:
        received.append(await request.json())
        return JSONResponse({"ok": True})

    hook_port = free_port()
    hook_server, hook_task = await serve_app(Starlette(routes=[Route("/hook", hook, methods=["POST"])]), hook_port)
    stack.settings.egress_internal_allowed.append(f"127.0.0.1:{hook_port}")  # the operator's allow-list
    try:
        async with stack.http() as http, stack.http(stack.other_key) as other:
            reference = await launch(http, {"dataset": str(tmp_path / "regress.jsonl"), "model": {
                "identifier": "openai/dev", "api_base": good.url}})
            await wait_terminal(http, reference["id"])
            # refusals first: a bad cadence, someone else's private run
            bad = await http.post("/v1/schedules", json={"replay_of": reference["id"], "every": "often"})
            assert bad.status_code == 400 and "every='often'" in bad.json()["error"]["message"]
            assert (await other.post("/v1/schedules", json={"replay_of": reference["id"], "every": "2s"})
                    ).status_code == 404

            resp = await http.post("/v1/schedules", json={
                "replay_of": reference["id"], "every": "2s", "alert": {"drop": 0.1, "p": 0.01},
                "webhook": f"http://127.0.0.1:{hook_port}/hook"})
            assert resp.status_code == 201, resp.text
            schedule_id = resp.json()["id"]
            assert (await other.get(f"/v1/schedules/{schedule_id}")).status_code == 404
            assert (await other.delete(f"/v1/schedules/{schedule_id}")).status_code == 404
            try:
                view = await _until(http, schedule_id, lambda v: any(r["status"] == "ok" for r in _completed(v)),
                                    "a replay at the reference's accuracy")
                same = next(r for r in _completed(view) if r["status"] == "ok")
                assert same["difference"] == 0 and not same["alerted"]  # the same model answers the same

                # the provider silently gets worse: same port, accuracy 0.9 -> 0.5
                await good.close()
                worse = await start_server(DevModelConfig(answers=answers, accuracy=0.5), port=model_port)
                dev_models.servers.append(worse)
                seen = len(_completed(view))
                view = await _until(http, schedule_id, lambda v: any(
                    r["status"] == "ongoing" for r in _completed(v)[seen:]), "a detection and an ongoing firing")
                paused = await http.patch(f"/v1/schedules/{schedule_id}", json={"paused": True})
                assert paused.status_code == 200 and paused.json()["paused"]
                view = await _until(http, schedule_id, lambda v: all(f["status"] != "RUNNING" for f in v["firings"]),
                                    "the last firing to finish")
            finally:
                assert (await http.delete(f"/v1/schedules/{schedule_id}")).status_code == 204
            assert (await http.get(f"/v1/schedules/{schedule_id}")).status_code == 404

            results = _completed(view)
            detected = [r for r in results if r["status"] == "detected"]
            assert len(detected) == 1 and detected[0]["alerted"], results
            assert detected[0]["webhook"] == "sent"  # the alert's delivery is part of the firing's record
            assert detected[0]["difference"] <= -0.1 and detected[0]["p_value"] <= 0.01
            assert sum(r["alerted"] for r in results) == 1
            alerts = 0
            for result in results:  # the event is in the replay's log, once, and only in the detecting replay's
                events = (await http.get(f"/v1/runs/{result['run_id']}/events")).json()["events"]
                found = [e for e in events if e["type"] == "RegressionDetected"]
                alerts += len(found)
                if found:
                    assert result["status"] == "detected"
                    assert found[0]["data"]["reference_run_id"] == reference["id"]
                    assert found[0]["data"]["schedule_id"] == schedule_id
            assert alerts == 1
            deadline = time.monotonic() + DEADLINE_S
            while not received:  # the webhook activity runs right after the check; poll for its delivery
                assert time.monotonic() < deadline, "the webhook was never called"
                await asyncio.sleep(0.1)
            assert len(received) == 1 and received[0]["run_id"] == detected[0]["run_id"]
            assert received[0]["type"] == "RegressionDetected" and received[0]["verdict"].startswith("B is worse")
            handle = stack.client.get_workflow_handle(view["firings"][-1]["workflow_id"])
            attrs = (await handle.describe()).typed_search_attributes
            assert any(pair.key.name == "BenchwrightRegression" for pair in attrs)
    finally:
        stack.settings.egress_internal_allowed.remove(f"127.0.0.1:{hook_port}")
        hook_server.should_exit = True
        await hook_task


async def test_schedules_list_per_account(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "one.jsonl").write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    async with stack.http() as http, stack.http(stack.other_key) as other:
        run = await launch(http, {"dataset": str(tmp_path / "one.jsonl"),
                                  "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await wait_terminal(http, run["id"])
        created = (await http.post("/v1/schedules", json={"replay_of": run["id"], "every": "0 6 * * *"})).json()
        try:
            assert created["paused"] is False and created["every"] == "0 6 * * *" and created["next_runs"]
            deadline = time.monotonic() + 30
            while created["id"] not in [s["id"] for s in (await http.get("/v1/schedules")).json()["schedules"]]:
                assert time.monotonic() < deadline, "the schedule never appeared in the list"
                await asyncio.sleep(0.2)
            assert created["id"] not in [s["id"] for s in (await other.get("/v1/schedules")).json()["schedules"]]
            resumed = await http.patch(f"/v1/schedules/{created['id']}", json={"paused": False})
            assert resumed.status_code == 200 and resumed.json()["paused"] is False
        finally:
            await http.delete(f"/v1/schedules/{created['id']}")


async def _outcome(http: httpx.AsyncClient, schedule_id: str) -> dict[str, Any]:
    view = await _until(http, schedule_id, lambda v: any(f["outcome"] != "running" for f in v["firings"]),
                        "a finished firing")
    return next(f for f in view["firings"] if f["outcome"] != "running")


async def test_an_undeliverable_webhook_is_refused_at_create_by_the_delivery_rules(stack: Stack,
                                                                                   tmp_path: Path) -> None:
    """Issues 22/23: loopback, link-local (the metadata address) and private webhooks, which delivery would always
    refuse, are refused when the schedule is created, with delivery's own words; the operator's allow-list, which
    delivery honours, is honoured here too."""
    (tmp_path / "one.jsonl").write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    async with stack.http() as http:
        run = await launch(http, {"dataset": str(tmp_path / "one.jsonl"),
                                  "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await wait_terminal(http, run["id"])
        for url, rule in (("http://127.0.0.1:9/hook", "loopback"), ("http://169.254.169.254/latest", "link-local"),
                          ("http://10.1.2.3/hook", "private"), ("http://[::1]:8080/hook", "loopback")):
            resp = await http.post("/v1/schedules", json={"replay_of": run["id"], "every": "1h", "webhook": url})
            assert resp.status_code == 400, (url, resp.text)
            error = resp.json()["error"]
            assert error["code"] == "webhook_blocked" and "internal address" in error["message"], error
            assert rule in error["message"], error
        port = free_port()
        stack.settings.egress_internal_allowed.append(f"127.0.0.1:{port}")
        try:
            allowed = await http.post("/v1/schedules", json={"replay_of": run["id"], "every": "1h",
                                                             "webhook": f"http://127.0.0.1:{port}/hook"})
            assert allowed.status_code == 201, allowed.text
            await http.delete(f"/v1/schedules/{allowed.json()['id']}")
        finally:
            stack.settings.egress_internal_allowed.remove(f"127.0.0.1:{port}")


async def test_a_schedule_is_refused_what_a_replay_is_refused_at_create_and_at_each_firing(
        stack: Stack, tmp_path: Path) -> None:
    """Issue 23: another account's unlisted run on a local dataset: POST /replay and /fork answer 400
    local_paths_disabled to an account without local paths, and so does POST /v1/schedules (the same admission).
    At firing time the same check runs again: an account that loses its local paths after creating a schedule gets
    a firing recorded as launch_refused with the reason, in the API and in `schedule show`."""
    from sqlmodel import Session

    from benchwright.store.accounts import create_account
    from benchwright.store.db import make_engine
    from benchwright.store.models import Account
    from tests.cli.test_cli_launch import bw

    engine = make_engine(stack.settings.resolved_database_url())
    (tmp_path / "one.jsonl").write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    _, no_local_key = create_account(engine, name=f"no-local-{free_port()}", balance_usd=10, local_paths=False)
    keeper, keeper_key = create_account(engine, name=f"keeper-{free_port()}", balance_usd=10, local_paths=True)
    async with stack.http() as http, stack.http(no_local_key) as outsider, stack.http(keeper_key) as own:
        run = await launch(http, {"dataset": str(tmp_path / "one.jsonl"), "visibility": "unlisted",
                                  "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await wait_terminal(http, run["id"])
        by_hand = await outsider.post(f"/v1/runs/{run['id']}/replay", json={"model": {
            "identifier": "openai/dev", "api_base": stack.dev_url}})
        assert by_hand.status_code == 400 and by_hand.json()["error"]["code"] == "local_paths_disabled"
        scheduled = await outsider.post("/v1/schedules", json={"replay_of": run["id"], "every": "1h"})
        assert scheduled.status_code == 400, scheduled.text
        assert scheduled.json()["error"] == by_hand.json()["error"]

        # the same account may schedule its own run while it may read local paths; then it loses them
        mine = await launch(own, {"dataset": str(tmp_path / "one.jsonl"),
                                  "model": {"identifier": "openai/dev", "api_base": stack.dev_url}})
        await wait_terminal(own, mine["id"])
        made = await own.post("/v1/schedules", json={"replay_of": mine["id"], "every": "1h"})
        assert made.status_code == 201, made.text
        schedule_id = made.json()["id"]
        try:
            with Session(engine) as session:
                account = session.get(Account, keeper.id)
                assert account is not None
                account.local_paths = False
                session.add(account)
                session.commit()
            await stack.client.get_schedule_handle(schedule_id).trigger()
            firing = await _outcome(own, schedule_id)
            assert firing["status"] == "COMPLETED" and firing["outcome"] == "launch_refused", firing
            assert firing["result"]["run_id"] is None
            assert "may not read datasets from local paths" in firing["reason"], firing
            assert "(local_paths_disabled)" in firing["reason"]
            shown = await bw("schedule", "show", schedule_id, env={"BENCHWRIGHT_API_URL": stack.api_url,
                                                                    "BENCHWRIGHT_API_KEY": keeper_key})
            assert shown.rc == 0, shown.err
            assert "launch_refused" in shown.out and "(local_paths_disabled)" in shown.out, shown.out
        finally:
            await own.delete(f"/v1/schedules/{schedule_id}")


async def test_an_alert_that_cannot_be_delivered_is_the_firings_recorded_outcome(stack: Stack, dev_models: DevModels,
                                                                                  tmp_path: Path) -> None:
    """The webhook passed create (the operator lists its endpoint) but nothing answers there when the alert is due:
    the firing still completes as ``detected`` and records the delivery's failure and reason (issue 22), instead
    of a FAILED firing whose reason only Temporal's history holds."""
    answers = {}
    with (tmp_path / "twenty.jsonl").open("w") as f:
        for i in range(20):
            answers[q := f"What is {i} plus 100? (item {i})"] = str(i + 100)
            f.write(json.dumps({"question": q, "answer": answers[q]}) + "\n")
    model_port = free_port()
    right = await start_server(DevModelConfig(answers=answers, accuracy=1.0), port=model_port)
    dev_models.servers.append(right)
    dead_port = free_port()  # allowed by the operator, but nothing listens there
    stack.settings.egress_internal_allowed.append(f"127.0.0.1:{dead_port}")
    try:
        async with stack.http() as http:
            reference = await launch(http, {"dataset": str(tmp_path / "twenty.jsonl"), "model": {
                "identifier": "openai/dev", "api_base": right.url}})
            await wait_terminal(http, reference["id"])
            await right.close()
            wrong = await start_server(DevModelConfig(answers=answers, accuracy=0.0), port=model_port)
            dev_models.servers.append(wrong)
            made = await http.post("/v1/schedules", json={"replay_of": reference["id"], "every": "1h",
                                                          "webhook": f"http://127.0.0.1:{dead_port}/hook"})
            assert made.status_code == 201, made.text
            schedule_id = made.json()["id"]
            try:
                await stack.client.get_schedule_handle(schedule_id).trigger()
                firing = await _outcome(http, schedule_id)
            finally:
                await http.delete(f"/v1/schedules/{schedule_id}")
            assert firing["status"] == "COMPLETED" and firing["outcome"] == "detected", firing
            assert firing["result"]["alerted"] and firing["result"]["webhook"].startswith("failed: "), firing
            assert "webhook failed: " in firing["reason"], firing
    finally:
        stack.settings.egress_internal_allowed.remove(f"127.0.0.1:{dead_port}")
