"""harbor's pluggable environment (``--env bw_harbor_env:BenchwrightEnvironment``) on Benchwright's sandboxes.

Runs inside harbor's process (the ``harbor_orchestrator`` sandbox, or a direct ``harbor run`` on the host), with
harbor's venv; never imported by the worker. Each trial's environment is a ``harbor_task_env`` sandbox the worker's
task-environment broker (``benchwright.harness.harbor.TaskEnvBroker``) creates on the run's backend: this class only
speaks the broker's HTTP protocol (``BW_HARBOR_ENV_URL``, key ``BW_HARBOR_ENV_KEY``). The broker maps the task's
``environment/`` onto the backend's template and refuses what cannot be mapped (a Dockerfile that needs a build, a
compose file, a prebuilt image), so ``start`` raises with the broker's reason. Files move as tar archives, packed
and unpacked inside the task sandbox (the broker never unpacks an archive it was given).
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

import httpx
from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities

TIMEOUT_S = 3600.0


class BrokerRefused(RuntimeError):
    """The broker refused the request (its message says why)."""


class BenchwrightEnvironment(BaseEnvironment):
    """A harbor environment whose container is a Benchwright task sandbox."""

    @staticmethod
    def type() -> str:
        return "benchwright"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities()

    def _validate_definition(self) -> None:
        pass  # the broker maps environment/ and refuses what it cannot map, naming it

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=os.environ["BW_HARBOR_ENV_URL"], timeout=TIMEOUT_S,
                                 headers={"authorization": f"Bearer {os.environ['BW_HARBOR_ENV_KEY']}"})

    async def _call(self, route: str, body: dict[str, Any] | None = None, *, params: dict[str, str] | None = None,
                    content: bytes | None = None) -> httpx.Response:
        async with self._client() as client:
            if content is not None:
                reply = await client.post(route, params=params, content=content)
            else:
                reply = await client.post(route, json=body or {}, params=params)
        if reply.status_code != 200:
            try:
                message = reply.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = reply.text[:2000]
            raise BrokerRefused(f"benchwright environment: {route} refused ({reply.status_code}): {message}")
        return reply

    async def start(self, force_build: bool) -> None:
        reply = await self._call("/start", {"environment_dir": str(Path(self.environment_dir).resolve()),
                                            "name": self.environment_name, "session": self.session_id,
                                            "env": self._startup_env()})
        self._env_id: str | None = str(reply.json()["id"])

    async def stop(self, delete: bool) -> None:
        env_id = getattr(self, "_env_id", None)
        if env_id is not None:
            await self._call("/stop", {"id": env_id})
            self._env_id = None

    def _id(self) -> str:
        env_id = getattr(self, "_env_id", None)
        if env_id is None:
            raise RuntimeError("benchwright environment: not started")
        return str(env_id)

    async def _put_tar(self, data: bytes, target_dir: str) -> None:
        await self._call("/upload", params={"id": self._id(), "target": target_dir}, content=data)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(str(source_path), arcname=os.path.basename(target_path))
        await self._put_tar(buf.getvalue(), os.path.dirname(target_path) or "/")

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for entry in sorted(os.listdir(source_dir)):
                tar.add(os.path.join(str(source_dir), entry), arcname=entry)
        await self._put_tar(buf.getvalue(), target_dir)

    async def _get_tar(self, source: str) -> tarfile.TarFile:
        reply = await self._call("/download", {"id": self._id(), "source": source})
        return tarfile.open(fileobj=io.BytesIO(reply.content), mode="r")

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        with await self._get_tar(source_path) as tar:
            member = next((m for m in tar.getmembers() if m.isfile()), None)
            if member is None:
                raise FileNotFoundError(source_path)
            extracted = tar.extractfile(member)
            assert extracted is not None
            Path(target_path).parent.mkdir(parents=True, exist_ok=True)
            Path(target_path).write_bytes(extracted.read())

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        Path(target_dir).mkdir(parents=True, exist_ok=True)
        with await self._get_tar(source_dir) as tar:
            tar.extractall(str(target_dir), filter="data")

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        reply = await self._call("/exec", {"id": self._id(), "command": command, "cwd": cwd,
                                           "env": self._merge_env(env) or {}, "timeout_sec": timeout_sec})
        data = reply.json()
        return ExecResult(stdout=data.get("stdout"), stderr=data.get("stderr"), return_code=int(data["return_code"]))
