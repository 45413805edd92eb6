"""A loopback E2B double, for testing the ``e2b`` backend with the real ``e2b`` SDK.

It is a *double*: it implements only what :mod:`benchwright.sandbox.e2b` uses, with the real wire protocols —

* the **sandbox REST API** (``X-API-KEY``): ``POST /v2/sandboxes`` (201, the ``Sandbox`` model with
  ``envdVersion``/``envdAccessToken``), ``POST /v2/sandboxes/{id}/connect``, ``GET /v2/sandboxes`` filtered by the
  url-encoded ``metadata`` query, ``DELETE /sandboxes/{id}`` (204; 404 ``Error`` when unknown);
* **envd**, addressed by the ``E2b-Sandbox-Id`` header as E2B's edge does, checked against ``X-Access-Token``:
  the ``process.Process`` Connect service (``Start`` server stream of start/data/end events, ``SendInput``,
  ``CloseStdin``, ``SendSignal``, ``List``) served by the SDK's own generated ``ProcessASGIApplication`` (so the
  Connect framing, JSON codec and error model are the real ones), and the HTTP file API (``GET``/``POST /files``,
  octet-stream uploads, ``/health``).

The SDK is pointed at it by its own configuration: ``api_url`` and ``sandbox_url`` (``E2B_API_URL`` /
``E2B_SANDBOX_URL``), HTTP/1.1. Each sandbox is a local-backend sandbox whose work directory stands for the E2B
user's home (``/home/user``); file paths outside it are refused. ``templates`` names templates whose image has
top-level directories of the user's (``{"harbor-ubuntu": ["logs", "tests", "solution", "app"]}``: links into the
work directory, the local backend's ``root_links``, made at creation). What it does not do: building templates,
pause/resume,
snapshots, PTYs, watches, the filesystem RPC service, lifetimes (``timeout`` is recorded, not enforced).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import signal
import socket
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import uvicorn
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.process import process_pb
from e2b.envd.process.process_connect import Process, ProcessASGIApplication
from protobuf import Oneof
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from benchwright.sandbox.base import ExecLimits, SandboxPathError
from benchwright.sandbox.local import ROOT_LINKS_KEY, LocalBackend, LocalProcess

HOME = "/home/user"
ENVD_VERSION = "0.5.7"
"""Old enough to need nothing the double lacks, new enough for ``CloseStdin`` (0.5.2) and octet-stream uploads."""
_WALL_S = 24 * 3600
_BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": HOME, "LANG": "C.UTF-8"}

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


@dataclass
class _Box:
    sandbox_id: str
    template: str
    metadata: dict[str, str]
    env: dict[str, str]
    token: str
    started_at: float
    backend: LocalBackend
    local_id: str
    limits: ExecLimits
    procs: dict[int, LocalProcess] = field(default_factory=dict)

    def model(self) -> dict[str, Any]:
        return {"templateID": self.template, "sandboxID": self.sandbox_id, "clientID": "double",
                "envdVersion": ENVD_VERSION, "envdAccessToken": self.token}

    def listed(self) -> dict[str, Any]:
        iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at))
        end = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at + _WALL_S))
        return {**self.model(), "startedAt": iso, "endAt": end, "cpuCount": int(self.limits.cpu_cores),
                "memoryMB": self.limits.memory_mb, "diskSizeMB": 10240, "state": "running",
                "metadata": self.metadata}


def _error(code: int, message: str) -> JSONResponse:
    return JSONResponse({"code": code, "message": message}, status_code=code)


class E2BDouble:
    """The E2B double on ``127.0.0.1:<free port>`` (see the module docstring). ``api_key`` is the key it accepts.

    Args:
        root: Where the sandboxes' local directories live.
        cpu_count, memory_mb: What every sandbox gets (its template's size, on E2B).
        templates: Template id -> the top-level directories its sandboxes' user owns (see the module docstring).
        local_options: Passed to the :class:`LocalBackend` (``allow_unisolated``...).
    """

    def __init__(self, root: Path, *, cpu_count: int = 2, memory_mb: int = 2048,
                 templates: Mapping[str, Sequence[str]] | None = None, **local_options: Any) -> None:
        self.api_key = f"e2b_{secrets.token_hex(20)}"
        self.templates = {k: list(v) for k, v in (templates or {}).items()}
        self.boxes: dict[str, _Box] = {}
        self.limits = ExecLimits(cpu_seconds=_WALL_S, memory_mb=memory_mb, wall_seconds=_WALL_S, max_processes=512,
                                 max_file_mb=1 << 20, cpu_cores=float(cpu_count))
        self.local = LocalBackend(Path(root), **local_options)
        self._pids = itertools.count(1000)
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.url = ""
        rest = Starlette(routes=[
            Route("/v2/sandboxes", self._create, methods=["POST"]),
            Route("/v2/sandboxes", self._list, methods=["GET"]),
            Route("/v2/sandboxes/{sid}/connect", self._connect, methods=["POST"]),
            Route("/sandboxes/{sid}", self._kill, methods=["DELETE"]),
            Route("/health", lambda _: Response(status_code=204), methods=["GET"]),
            Route("/files", self._read_file, methods=["GET"]),
            Route("/files", self._write_file, methods=["POST"]),
        ])
        process = ProcessASGIApplication(cast(Process, _ProcessService(self)))
        self._rest: ASGIApp = rest
        self._process: ASGIApp = process

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/process.Process/"):
            box = self._box_of({k.decode().lower(): v.decode() for k, v in scope["headers"]})
            if box is None:
                await _error(401, "unknown sandbox or access token")(scope, receive, send)
                return
            await self._process(scope, receive, send)
            return
        await self._rest(scope, receive, send)

    async def start(self) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self, host="127.0.0.1", port=port, log_level="warning",
                                                     lifespan="off"))
        self._task = asyncio.create_task(self._server.serve())
        deadline = time.monotonic() + 10
        while not self._server.started:
            if self._task.done() or time.monotonic() > deadline:
                raise RuntimeError("the E2B double did not start")
            await asyncio.sleep(0.01)  # polling uvicorn's started flag, bounded by the deadline
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        for box in list(self.boxes.values()):
            await self._destroy(box)
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        await self.local.close()

    # -- REST API -----------------------------------------------------------------------------------------------

    def _authorized(self, request: Request) -> bool:
        return request.headers.get("x-api-key") == self.api_key

    async def _create(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(401, "Invalid API key")
        body = await request.json()
        metadata = {str(k): str(v) for k, v in (body.get("metadata") or {}).items()}
        template = str(body.get("templateID", "base"))
        dirs = self.templates.get(template, [])
        info = await self.local.create(role=metadata.get("benchwright_role", "work"),
                                       run_id=metadata.get("benchwright_run_id", "double"),
                                       metadata={ROOT_LINKS_KEY: dirs} if dirs else None)
        if dirs:
            await self.local.exec(info.sandbox_id, ["mkdir", "-p", *dirs], env=_BASE_ENV, timeout_s=30,
                                  limits=self.limits)
        sid = f"i{secrets.token_hex(9)}"
        box = _Box(sandbox_id=sid, template=template, metadata=metadata,
                   env={**_BASE_ENV, **(body.get("envVars") or {})}, token=secrets.token_hex(16),
                   started_at=time.time(), backend=self.local, local_id=info.sandbox_id, limits=self.limits)
        self.boxes[sid] = box
        return JSONResponse(box.model(), status_code=201)

    async def _connect(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(401, "Invalid API key")
        box = self.boxes.get(request.path_params["sid"])
        if box is None:
            return _error(404, f"sandbox {request.path_params['sid']} not found")
        return JSONResponse(box.model(), status_code=200)

    async def _list(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(401, "Invalid API key")
        wanted = dict(urllib.parse.parse_qsl(request.query_params.get("metadata", "")))
        return JSONResponse([b.listed() for b in self.boxes.values()
                             if all(b.metadata.get(k) == v for k, v in wanted.items())])

    async def _kill(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(401, "Invalid API key")
        box = self.boxes.pop(request.path_params["sid"], None)
        if box is None:
            return _error(404, f"sandbox {request.path_params['sid']} not found")
        await self._destroy(box)
        return Response(status_code=204)

    async def _destroy(self, box: _Box) -> None:
        for proc in list(box.procs.values()):
            proc.kill()
        await self.local.kill(box.local_id)

    # -- envd ---------------------------------------------------------------------------------------------------

    def _box_of(self, headers: Any) -> _Box | None:
        """The sandbox a request is for (``E2b-Sandbox-Id``), if its ``X-Access-Token`` is that sandbox's."""
        box = self.boxes.get(headers.get("e2b-sandbox-id") or "")
        return box if box is not None and headers.get("x-access-token") == box.token else None

    @staticmethod
    def _relative(path: str) -> str:
        if not path.startswith(HOME + "/"):
            raise SandboxPathError(f"the double serves files under {HOME} only, not {path!r}")
        return path[len(HOME) + 1:]

    async def _read_file(self, request: Request) -> Response:
        box = self._box_of(request.headers)
        if box is None:
            return _error(401, "unknown sandbox or access token")
        try:
            data = await self.local.read_file(box.local_id, self._relative(request.query_params["path"]))
        except FileNotFoundError:
            return _error(404, f"path '{request.query_params['path']}' does not exist")
        except SandboxPathError as exc:
            return _error(400, str(exc))
        return Response(data, media_type="application/octet-stream")

    async def _write_file(self, request: Request) -> Response:
        box = self._box_of(request.headers)
        if box is None:
            return _error(401, "unknown sandbox or access token")
        if request.headers.get("content-type") != "application/octet-stream":
            return _error(400, "the double takes octet-stream uploads only")
        path = request.query_params["path"]
        try:
            await self.local.write_file(box.local_id, self._relative(path), await request.body())
        except SandboxPathError as exc:
            return _error(400, str(exc))
        return JSONResponse([{"name": path.rsplit("/", 1)[-1], "type": "file", "path": path}])


class _ProcessService:
    """The ``process.Process`` Connect service of envd, over the local sandbox of the calling sandbox."""

    def __init__(self, double: E2BDouble) -> None:
        self.double = double

    def _box(self, ctx: RequestContext[Any, Any]) -> _Box:
        box = self.double._box_of(ctx.request_headers)
        if box is None:
            raise ConnectError(Code.UNAUTHENTICATED, "unknown sandbox or access token")
        return box

    def _proc(self, ctx: RequestContext[Any, Any], selector: process_pb.ProcessSelector | None) -> LocalProcess:
        box = self._box(ctx)
        pid = selector.selector.value if selector is not None and selector.selector is not None else None
        proc = box.procs.get(pid) if isinstance(pid, int) else None
        if proc is None:
            raise ConnectError(Code.NOT_FOUND, f"process with pid {pid} not found")
        return proc

    async def start(self, request: process_pb.StartRequest,
                    ctx: RequestContext[Any, Any]) -> AsyncIterator[process_pb.StartResponse]:
        box = self._box(ctx)
        config = request.process or process_pb.ProcessConfig()
        env = {**box.env, **(config.envs or {})}
        proc = await self.double.local.spawn(box.local_id, [config.cmd, *(config.args or [])], env=env,
                                             limits=box.limits)
        if not request.stdin and proc.stdin is not None:
            proc.stdin.close()
        pid = next(self.double._pids)
        box.procs[pid] = proc
        events: asyncio.Queue[process_pb.ProcessEvent | None] = asyncio.Queue()

        async def pump(stream: asyncio.StreamReader | None, name: Literal["stdout", "stderr"]) -> None:
            assert stream is not None
            while chunk := await stream.read(1 << 16):
                output: Oneof[Literal["stdout", "stderr"], bytes] = Oneof(name, chunk)
                data = process_pb.ProcessEvent.DataEvent(output=cast(Any, output))
                await events.put(process_pb.ProcessEvent(event=Oneof[Literal["data"], Any]("data", data)))

        pumps = [asyncio.create_task(pump(proc.stdout, "stdout")), asyncio.create_task(pump(proc.stderr, "stderr"))]
        finished = asyncio.create_task(self._finish(proc, pumps, events))
        try:
            yield process_pb.StartResponse(event=process_pb.ProcessEvent(
                event=Oneof[Literal["start"], Any]("start", process_pb.ProcessEvent.StartEvent(pid=pid))))
            while (event := await events.get()) is not None:
                yield process_pb.StartResponse(event=event)
        finally:
            if proc.returncode is None:  # the client went away: the command ends with its stream
                proc.kill()
            with contextlib.suppress(Exception):
                await finished
            box.procs.pop(pid, None)

    @staticmethod
    async def _finish(proc: LocalProcess, pumps: list[asyncio.Task[None]],
                      events: asyncio.Queue[process_pb.ProcessEvent | None]) -> None:
        rc = await proc.wait()
        await asyncio.gather(*pumps, return_exceptions=True)
        if rc < 0:
            try:
                status = f"signal: {signal.Signals(-rc).name.removeprefix('SIG').lower()}"
            except ValueError:
                status = f"signal: {-rc}"
            code = 128 - rc
        else:
            status, code = f"exit status {rc}", rc
        end = process_pb.ProcessEvent.EndEvent(exit_code=code, exited=rc >= 0, status=status)
        await events.put(process_pb.ProcessEvent(event=Oneof[Literal["end"], Any]("end", end)))
        await events.put(None)

    async def send_input(self, request: process_pb.SendInputRequest,
                         ctx: RequestContext[Any, Any]) -> process_pb.SendInputResponse:
        proc = self._proc(ctx, request.process)
        data = request.input.input.value if request.input is not None and request.input.input is not None else b""
        if proc.stdin is None or proc.stdin.is_closing():
            raise ConnectError(Code.FAILED_PRECONDITION, "stdin is closed")
        proc.stdin.write(bytes(data))
        with contextlib.suppress(ConnectionError):
            await proc.stdin.drain()
        return process_pb.SendInputResponse()

    async def close_stdin(self, request: process_pb.CloseStdinRequest,
                          ctx: RequestContext[Any, Any]) -> process_pb.CloseStdinResponse:
        proc = self._proc(ctx, request.process)
        if proc.stdin is not None:
            proc.stdin.close()
        return process_pb.CloseStdinResponse()

    async def send_signal(self, request: process_pb.SendSignalRequest,
                          ctx: RequestContext[Any, Any]) -> process_pb.SendSignalResponse:
        self._proc(ctx, request.process).kill()
        return process_pb.SendSignalResponse()

    async def list(self, request: process_pb.ListRequest, ctx: RequestContext[Any, Any]) -> process_pb.ListResponse:
        box = self._box(ctx)
        return process_pb.ListResponse(processes=[process_pb.ProcessInfo(pid=pid) for pid in box.procs])

    def connect(self, request: process_pb.ConnectRequest,
                ctx: RequestContext[Any, Any]) -> AsyncIterator[process_pb.ConnectResponse]:
        raise ConnectError(Code.UNIMPLEMENTED, "the double does not reconnect to processes")

    async def update(self, request: process_pb.UpdateRequest,
                     ctx: RequestContext[Any, Any]) -> process_pb.UpdateResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "the double has no PTYs")

    async def stream_input(self, request: AsyncIterator[process_pb.StreamInputRequest],
                           ctx: RequestContext[Any, Any]) -> process_pb.StreamInputResponse:
        raise ConnectError(Code.UNIMPLEMENTED, "the double takes SendInput, not StreamInput")
