"""The deployment key and the Temporal payload codec (``benchwright.security.crypto``,
``benchwright.security.payload_codec``)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from benchwright.security.crypto import (
    DecryptionFailed,
    DeploymentKeyError,
    Keyring,
    ensure_key_file,
    key_id,
    load_keyring,
    parse_keys,
    write_key_file,
)
from benchwright.security.payload_codec import ENCODING, EncryptionCodec, codec_json, data_converter
from benchwright.settings import Settings
from benchwright.stack.workflow_runner import workflow_runner
from worker import PASSTHROUGH
from workflows.operator import OperatorWorkflow
from workflows.regression import RegressionWorkflow
from workflows.run import RunWorkflow

ASYNC = pytest.mark.asyncio(loop_scope="session")
HISTORIES = Path(__file__).resolve().parents[1] / "replay" / "histories"


def _key() -> bytes:
    return os.urandom(32)


def test_the_key_file_is_made_once_with_mode_0600_and_read_back(tmp_path: Path) -> None:
    path = ensure_key_file(tmp_path)
    assert path.stat().st_mode & 0o777 == 0o600
    first = path.read_text()
    assert ensure_key_file(tmp_path).read_text() == first, "an existing key is never replaced"
    keyring = load_keyring(Settings(data_dir=tmp_path))
    assert keyring is not None and keyring.source == str(path) and len(keyring.ids) == 1


def test_the_environment_wins_and_lists_several_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ensure_key_file(tmp_path)
    new, old = _key(), _key()
    listed = ",".join(base64.b64encode(k).decode() for k in (new, old))
    monkeypatch.setenv("BENCHWRIGHT_DEPLOYMENT_KEY", listed)
    keyring = load_keyring(Settings(data_dir=tmp_path))
    assert keyring is not None and keyring.ids == [key_id(new), key_id(old)] and keyring.primary_id == key_id(new)
    assert load_keyring(Settings(data_dir=tmp_path / "none", deployment_key=None)) is None


@pytest.mark.parametrize("text", ["", "not base64!", base64.b64encode(b"short").decode(), "# only a comment"])
def test_a_malformed_key_is_refused_with_the_reason(text: str) -> None:
    with pytest.raises(DeploymentKeyError) as caught:
        parse_keys(text, where="the test")
    assert "the test" in caught.value.message


def test_no_dataset_path_reads_the_deployment_key(tmp_path: Path) -> None:
    """An account allowed local dataset paths still cannot name the key file, in the data directory or elsewhere."""
    from benchwright.data.dataset_access import LocalPathRules, check_local_path
    from benchwright.errors import DatasetError

    elsewhere = tmp_path / "etc" / "bw.key"
    elsewhere.parent.mkdir()
    write_key_file(elsewhere, [_key()])
    data_dir = tmp_path / "data"
    for settings, path in ((Settings(data_dir=data_dir, deployment_key_file=elsewhere, allow_local_paths=True),
                            elsewhere),
                           (Settings(data_dir=data_dir, allow_local_paths=True), ensure_key_file(data_dir))):
        with pytest.raises(DatasetError, match="secrets"):
            check_local_path(str(path), LocalPathRules.from_settings(settings, account_local_paths=True),
                             must_exist=True)


def test_values_are_bound_to_their_owner_and_their_key() -> None:
    ring = Keyring([_key()], source="test")
    kid, blob = ring.encrypt(b"sk-live", aad=b"row-1")
    assert ring.decrypt(kid, blob, aad=b"row-1") == b"sk-live"
    with pytest.raises(DecryptionFailed):
        ring.decrypt(kid, blob, aad=b"row-2")  # copied onto another row
    with pytest.raises(DecryptionFailed):
        ring.decrypt(kid, blob[:-1] + bytes([blob[-1] ^ 1]), aad=b"row-1")
    with pytest.raises(DeploymentKeyError):
        Keyring([_key()], source="other").decrypt(kid, blob, aad=b"row-1")


def test_a_key_file_rewritten_by_a_rotation_is_picked_up_by_a_running_process(tmp_path: Path) -> None:
    old, new = _key(), _key()
    path = tmp_path / "keys"
    write_key_file(path, [old])
    ring = load_keyring(Settings(data_dir=tmp_path, deployment_key_file=path))
    assert ring is not None
    kid, blob = ring.encrypt(b"x", aad=b"")
    write_key_file(path, [new, old])
    assert ring.primary_id == key_id(new) and ring.decrypt(kid, blob, aad=b"") == b"x"
    assert path.stat().st_mode & 0o777 == 0o600


@ASYNC
async def test_the_codec_encrypts_every_payload_and_passes_unencrypted_ones_through() -> None:
    codec = EncryptionCodec(Keyring([_key()], source="test"))
    plain = Payload(metadata={"encoding": b"json/plain"}, data=b'{"task_impl": "SECRET SCORER"}')
    [sealed] = await codec.encode([plain])
    assert sealed.metadata["encoding"] == ENCODING and b"SECRET" not in sealed.SerializeToString()
    assert await codec.decode([sealed, plain]) == [plain, plain]
    wire = codec_json(codec, {"payloads": [{"metadata": {"encoding": base64.b64encode(b"json/plain").decode()},
                                            "data": base64.b64encode(b'"hi"').decode()}]}, op="encode")
    back = codec_json(codec, wire, op="decode")
    assert base64.b64decode(back["payloads"][0]["data"]) == b'"hi"'


@ASYNC
async def test_failures_are_encrypted_too() -> None:
    """A failure's message (which may quote a task's output) travels as an encoded attribute, not in clear."""
    from temporalio.api.failure.v1 import Failure
    from temporalio.exceptions import ApplicationError

    converter = data_converter(Keyring([_key()], source="test"))
    failure = Failure()
    await converter.encode_failure(ApplicationError("task output: MARKER-42"), failure)
    assert b"MARKER-42" not in failure.SerializeToString()
    decoded = await converter.decode_failure(failure)
    assert "MARKER-42" in str(decoded)


@ASYNC
@pytest.mark.parametrize("name", sorted(p.name for p in HISTORIES.glob("*.json")))
async def test_histories_recorded_without_encryption_replay_on_an_encrypting_worker(name: str) -> None:
    converter = data_converter(Keyring([_key()], source="test"))
    replayer = Replayer(workflows=[RunWorkflow, RegressionWorkflow, OperatorWorkflow], data_converter=converter,
                        workflow_runner=workflow_runner(converter, PASSTHROUGH))
    history = WorkflowHistory.from_json(name, (HISTORIES / name).read_text())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{name}: {result.replay_failure}"
