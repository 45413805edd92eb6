"""The deployment key as an operator meets it (issue 23): ``benchwright up`` makes it (0600) and encrypts with it,
Temporal's database file holds no private payload, the Temporal UI decodes through the API's codec path; ``keys
rotate``/``retire`` move every secret to a new key; API and worker refuse to start without the key; ``accounts
rotate-key``/``revoke-key`` kill the old key at once."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from benchwright.errors import Unauthorized
from benchwright.security.crypto import KEY_FILE_NAME, ensure_key_file, key_id, load_keyring, read_key_file
from benchwright.settings import Settings
from benchwright.stack.devstack import free_port, temporal_binary
from benchwright.store.accounts import authenticate, create_account
from benchwright.store.db import make_engine, migrate
from benchwright.store.policy import prepare_secrets, put_secret, secret_keys_in_use, secret_value
from benchwright.testkit.devmodel import DevModelConfig, load_answers, start_server
from tests.api.test_encryption import ENCRYPTED, IMPL, _readable
from tests.cli.test_stack import BW, SAMPLE, _stop, _up, _wait_file

TERMINAL = {"ok", "error", "failed", "halted", "killed", "stopped"}


def _bytes_of(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in (db, Path(f"{db}-wal")) if p.exists())


async def _show(address: str, run_id: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        temporal_binary(), "workflow", "show", "--workflow-id", run_id, "--output", "json", "--address", address,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def _first_input(history: str) -> dict:  # type: ignore[type-arg]
    started = json.loads(history)["events"][0]["workflowExecutionStartedEventAttributes"]
    return started["input"]["payloads"][0]  # type: ignore[no-any-return]


@pytest.mark.asyncio(loop_scope="session")
async def test_up_encrypts_with_its_key_and_its_temporal_ui_decodes(tmp_path: Path) -> None:
    data_dir = tmp_path / "stack"
    data_dir.mkdir()
    ports = {"api": free_port(), "temporal": free_port(), "ui": free_port()}
    provider_key = f"sk-up-{uuid.uuid4().hex}"
    code_marker, output_marker = uuid.uuid4().hex, f"OUTPUT-{uuid.uuid4().hex}"
    model = await start_server(DevModelConfig(answers=load_answers(SAMPLE), api_key=provider_key))
    up = _up(data_dir, ports)
    try:
        dev = await asyncio.to_thread(_wait_file, data_dir / "dev.json", up)
        key_file = data_dir / KEY_FILE_NAME
        assert key_file.stat().st_mode & 0o777 == 0o600, "made on first start, readable by its owner only"
        async with httpx.AsyncClient(base_url=dev["api_url"], timeout=60,
                                     headers={"Authorization": f"Bearer {dev['api_key']}"}) as http:
            assert (await http.post("/v1/secrets", json={"name": "K", "value": provider_key})).status_code == 201
            made = await http.post("/v1/runs", json={
                "dataset": str(SAMPLE), "visibility": "private",
                "task_impl": IMPL % {"code_marker": code_marker, "reversed_output": output_marker[::-1]},
                "model": {"identifier": "openai/dev", "api_base": model.url, "secret": "K"}})
            assert made.status_code == 201, made.text
            run_id = made.json()["id"]
            deadline = time.monotonic() + 120
            while (run := (await http.get(f"/v1/runs/{run_id}")).json())["status"] not in TERMINAL:
                assert time.monotonic() < deadline, run
                await asyncio.sleep(0.2)
        assert run["status"] == "ok" and run["tasks"]["summary"]["pass_rate"] == 1.0, "the key reached the model"

        raw = await _show(dev["temporal_address"], run_id)
        readable = _readable(raw)
        assert ENCRYPTED in readable and code_marker not in readable and output_marker not in readable

        # The dev server's UI is pointed at the API's codec path, and that path decodes for the UI's origin.
        ui = dev["temporal_ui_url"]
        async with httpx.AsyncClient(timeout=30) as http:
            settings = (await http.get(f"{ui}/api/v1/settings")).json()
            endpoint = settings["Codec"]["Endpoint"]
            assert endpoint.startswith(f"{dev['api_url']}/v1/admin/codec/ui/")
            preflight = await http.options(f"{endpoint}/decode", headers={
                "Origin": ui, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,x-namespace"})
            assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ui
            opened = await http.post(f"{endpoint}/decode", json={"payloads": [_first_input(raw)]},
                                     headers={"Origin": ui, "X-Namespace": "default"})
            assert opened.status_code == 200 and opened.headers["access-control-allow-origin"] == ui
            assert code_marker in base64.b64decode(opened.json()["payloads"][0]["data"]).decode()
            elsewhere = await http.options(f"{dev['api_url']}/v1/runs", headers={
                "Origin": ui, "Access-Control-Request-Method": "GET"})
            assert "access-control-allow-origin" not in elsewhere.headers, "CORS opens the codec path only"
            wrong = await http.post(f"{dev['api_url']}/v1/admin/codec/ui/{'0' * 64}/decode",
                                    json={"payloads": [_first_input(raw)]})
            assert wrong.status_code == 404
    finally:
        assert await asyncio.to_thread(_stop, up) == 0
        await model.close()
    # Temporal's database file (and WAL) and the store hold the payloads encrypted, the key in no byte.
    temporal_db = _bytes_of(data_dir / "temporal.db")
    assert b"binary/encrypted" in temporal_db, "the history is in this file"
    for private in (code_marker, output_marker, provider_key):
        assert private.encode() not in temporal_db, private
    assert provider_key.encode() not in _bytes_of(data_dir / "benchwright.db")


def _store_with_secret(data_dir: Path) -> tuple[str, str]:
    ensure_key_file(data_dir)
    settings = Settings(data_dir=data_dir)
    engine = make_engine(settings.resolved_database_url())
    migrate(engine)
    prepare_secrets(engine, load_keyring(settings))
    account, _ = create_account(engine, name="a")
    value = f"sk-{uuid.uuid4().hex}"
    put_secret(engine, account_id=account.id, name="K", value=value, host_pattern=None)
    engine.dispose()
    return account.id, value


def _bw(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*BW, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def test_keys_rotate_moves_every_secret_to_a_new_key_and_retire_drops_the_old(tmp_path: Path) -> None:
    account_id, value = _store_with_secret(tmp_path)
    old = key_id(read_key_file(tmp_path / KEY_FILE_NAME)[0])
    rotated = _bw("keys", "rotate", "--data-dir", str(tmp_path))
    assert rotated.returncode == 0, rotated.stderr
    keys = read_key_file(tmp_path / KEY_FILE_NAME)
    new = key_id(keys[0])
    assert len(keys) == 2 and key_id(keys[1]) == old and "re-encrypted 1 secret" in rotated.stderr
    listed = _bw("keys", "list", "--data-dir", str(tmp_path))
    assert listed.returncode == 0 and new in listed.stdout and old in listed.stdout
    refused = _bw("keys", "retire", old, "--data-dir", str(tmp_path))
    assert refused.returncode == 1 and "--yes" in refused.stderr, "Temporal histories may still need it"
    assert _bw("keys", "retire", new, "--yes", "--data-dir", str(tmp_path)).returncode == 1, "the encrypting key"
    retired = _bw("keys", "retire", old, "--yes", "--data-dir", str(tmp_path))
    assert retired.returncode == 0, retired.stderr
    assert [key_id(k) for k in read_key_file(tmp_path / KEY_FILE_NAME)] == [new]
    settings = Settings(data_dir=tmp_path)
    engine = make_engine(settings.resolved_database_url())
    prepare_secrets(engine, load_keyring(settings))
    assert secret_keys_in_use(engine) == {new: 1}
    assert secret_value(engine, account_id=account_id, name="K") == value
    engine.dispose()


def test_api_and_worker_refuse_to_start_with_encrypted_secrets_and_no_key(tmp_path: Path) -> None:
    _store_with_secret(tmp_path)
    (tmp_path / KEY_FILE_NAME).rename(tmp_path / "elsewhere.key")
    worker = _bw("worker", "--data-dir", str(tmp_path))
    assert worker.returncode == 1 and "refusing to start" in worker.stderr and "Traceback" not in worker.stderr
    assert "BENCHWRIGHT_DEPLOYMENT_KEY" in worker.stderr
    api = subprocess.run([sys.executable, "-m", "uvicorn", "api.main:create_app", "--factory", "--port",
                          str(free_port())], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "BENCHWRIGHT_DATA_DIR": str(tmp_path)})
    assert api.returncode != 0 and "refusing to start" in api.stderr + api.stdout


def test_accounts_rotate_key_and_revoke_key_kill_the_old_key_at_once(tmp_path: Path) -> None:
    made = _bw("accounts", "create", "alice", "--data-dir", str(tmp_path))
    assert made.returncode == 0, made.stderr
    first = made.stdout.strip()
    engine = make_engine(Settings(data_dir=tmp_path).resolved_database_url())
    rotated = _bw("accounts", "rotate-key", "alice", "--data-dir", str(tmp_path))
    assert rotated.returncode == 0, rotated.stderr
    second = rotated.stdout.strip()
    with pytest.raises(Unauthorized):
        authenticate(engine, first)
    assert authenticate(engine, second).name == "alice"
    added = _bw("accounts", "add-key", "alice", "--key-name", "ci", "--data-dir", str(tmp_path))
    assert added.returncode == 0 and authenticate(engine, added.stdout.strip()).name == "alice"
    listed = _bw("accounts", "keys", "alice", "--data-dir", str(tmp_path))
    assert listed.returncode == 0 and "default" in listed.stdout and "ci" in listed.stdout
    assert second not in listed.stdout
    revoked = _bw("accounts", "revoke-key", "alice", "--key-name", "default", "--data-dir", str(tmp_path))
    assert revoked.returncode == 0, revoked.stderr
    with pytest.raises(Unauthorized):
        authenticate(engine, second)
    last = _bw("accounts", "revoke-key", "alice", "--key-name", "ci", "--data-dir", str(tmp_path))
    assert last.returncode == 1 and "only API key" in last.stderr
    engine.dispose()
