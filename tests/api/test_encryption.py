"""Nothing private rests in clear (issue 23): a private run's provider key is encrypted in the store and still
reaches the model through the credential proxy; its scorer code and task outputs are encrypted in Temporal's
history, which decodes through the codec endpoint for an admin and for no one else."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from pathlib import Path

import httpx
import pytest

from api.main import create_app
from benchwright.settings import Settings
from benchwright.stack.devstack import free_port, temporal_binary
from benchwright.store.accounts import create_account
from benchwright.store.db import make_engine, migrate
from benchwright.testkit.devmodel import DevModelConfig, load_answers
from tests.api.helpers import launch, wait_terminal
from tests.conftest import SAMPLE, DevModels, Stack, serve_app

pytestmark = pytest.mark.asyncio(loop_scope="session")

ENCRYPTED = "YmluYXJ5L2VuY3J5cHRlZA=="  # base64 of binary/encrypted, as proto JSON spells metadata

IMPL = '''
# SCORER-CODE-%(code_marker)s
OUTPUT_TAG = "".join(reversed(%(reversed_output)r))  # the output's marker is not spelled out in the code


class Scorer:
    def extract(self, row):
        return row["question"]

    def solve(self, row, call_sut):
        return call_sut(self.extract(row)).strip() + " " + OUTPUT_TAG

    def score(self, row, response):
        return 1.0 if response.split()[0] == row["answer"] else 0.0
'''


async def _show(stack: Stack, run_id: str, *extra: str) -> str:
    """``temporal workflow show --output json`` (a subprocess that does not block the loop the API serves on)."""
    proc = await asyncio.create_subprocess_exec(
        temporal_binary(), "workflow", "show", "--workflow-id", run_id, "--output", "json",
        "--address", stack.settings.temporal_address, *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def _readable(history_json: str) -> str:
    """The history as a reader sees it: its JSON plus every payload's data base64-decoded (proto JSON spells
    payload data in base64, so a plaintext payload's text is only visible decoded)."""
    parts = [history_json]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("data"), str) and isinstance(node.get("metadata"), dict):
                parts.append(base64.b64decode(node["data"]).decode(errors="replace"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(history_json))
    return "\n".join(parts)


def _store_bytes(stack: Stack) -> bytes:
    db = stack.data_dir / "benchwright.db"
    return b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal")) if p.exists())


async def test_a_private_runs_key_code_and_outputs_never_rest_in_clear(stack: Stack, dev_models: DevModels) -> None:
    provider_key = f"sk-enc-{uuid.uuid4().hex}"
    code_marker, output_marker = uuid.uuid4().hex, f"OUTPUT-{uuid.uuid4().hex}"
    keyed = await dev_models.start(DevModelConfig(answers=load_answers(SAMPLE / "arithmetic.jsonl"),
                                                  api_key=provider_key))
    async with stack.http() as http:
        assert (await http.post("/v1/secrets", json={"name": "ENCKEY", "value": provider_key})).status_code == 201
        run = await launch(http, {
            "dataset": str(SAMPLE / "arithmetic.jsonl"), "visibility": "private",
            "task_impl": IMPL % {"code_marker": code_marker, "reversed_output": output_marker[::-1]},
            "model": {"identifier": "openai/dev", "api_base": keyed, "secret": "ENCKEY"}})
        await wait_terminal(http, run["id"])
        final = (await http.get(f"/v1/runs/{run['id']}")).json()
        tasks = (await http.get(f"/v1/runs/{run['id']}/tasks", params={"limit": 5})).json()
    # The dev model answers 401 to any other key: a perfect score means the decrypted key reached it.
    assert final["status"] == "ok" and final["tasks"]["summary"]["pass_rate"] == 1.0, final
    assert output_marker in json.dumps(tasks), "the outputs carry the marker the history must not"

    # The store: the provider key is in no byte of the SQLite file or its WAL.
    assert provider_key.encode() not in _store_bytes(stack)

    # Temporal's history without the codec: encrypted payloads, none of the scorer code, outputs or key.
    raw = _readable(await _show(stack, run["id"]))
    assert ENCRYPTED in raw
    for private in (code_marker, output_marker, provider_key, "class Scorer"):
        assert private not in raw, private
    history = _readable((await stack.client.get_workflow_handle(run["id"]).fetch_history()).to_json())
    assert code_marker not in history and output_marker not in history and ENCRYPTED in history

    # With the codec endpoint and an admin key, the same history decodes.
    engine = make_engine(stack.settings.resolved_database_url())
    _, admin = create_account(engine, name=f"ops-{uuid.uuid4().hex[:6]}", admin=True)
    engine.dispose()
    decoded = _readable(await _show(stack, run["id"], "--codec-endpoint", f"{stack.api_url}/v1/admin/codec",
                                    "--codec-auth", f"Bearer {admin}"))
    assert code_marker in decoded and "class Scorer" in decoded and ENCRYPTED not in decoded


async def test_the_codec_endpoint_decodes_for_admins_only(stack: Stack) -> None:
    secret_text = f"launch body {uuid.uuid4().hex}"
    payload = {"metadata": {"encoding": "anNvbi9wbGFpbg=="},  # json/plain
               "data": base64.b64encode(json.dumps(secret_text).encode()).decode()}
    engine = make_engine(stack.settings.resolved_database_url())
    _, admin = create_account(engine, name=f"ops-{uuid.uuid4().hex[:6]}", admin=True)
    engine.dispose()
    async with stack.http(admin) as http:
        sealed = await http.post("/v1/admin/codec/encode", json={"payloads": [payload]})
        assert sealed.status_code == 200, sealed.text
        [enc] = sealed.json()["payloads"]
        assert enc["metadata"]["encoding"] == ENCRYPTED and secret_text not in json.dumps(enc)
        opened = await http.post("/v1/admin/codec/decode", json={"payloads": [enc, payload]})
        assert opened.status_code == 200 and opened.json()["payloads"] == [payload, payload]
        bad = await http.post("/v1/admin/codec/decode", json={"payloads": "nope"})
        assert bad.status_code == 400
    for key in (stack.api_key, None, "bw_not-a-key"):  # a user, nobody, a wrong key: the admin surface's 404
        async with stack.http(key) as http:
            refused = await http.post("/v1/admin/codec/decode", json={"payloads": [enc]})
            assert refused.status_code == 404 and secret_text not in refused.text
    async with stack.http(None) as http:  # the Temporal UI's path exists only where `up` turns it on
        assert (await http.post(f"/v1/admin/codec/ui/{'0' * 64}/decode", json={"payloads": [enc]})).status_code == 404


async def test_without_a_deployment_key_no_secret_is_stored(tmp_path: Path) -> None:
    """A deployment with no key refuses to store a secret (503 naming what to set) rather than keep it in clear."""
    settings = Settings(data_dir=tmp_path)
    engine = make_engine(settings.resolved_database_url())
    migrate(engine)
    _, key = create_account(engine, name="keyless")
    port = free_port()
    server, task = await serve_app(create_app(settings), port)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                     headers={"Authorization": f"Bearer {key}"}) as http:
            refused = await http.post("/v1/secrets", json={"name": "K", "value": "sk-never-stored"})
            listed = (await http.get("/v1/secrets")).json()["secrets"]
    finally:
        server.should_exit = True
        await task
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "no_deployment_key"
    assert "BENCHWRIGHT_DEPLOYMENT_KEY" in refused.json()["error"]["message"] and listed == []
    assert b"sk-never-stored" not in (tmp_path / "benchwright.db").read_bytes()
    engine.dispose()
