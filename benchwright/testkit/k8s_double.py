"""A loopback Kubernetes API server double, for testing the ``sandbox0`` backend with the real ``kubernetes`` client.

It is a *double*: it implements only what :mod:`benchwright.sandbox.sandbox0` uses, with the real wire protocol —

* ``/api/v1/namespaces/{ns}/pods``: create, read, list (equality ``labelSelector``), delete; JSON objects the
  client deserializes into ``V1Pod``/``V1PodList``; errors as ``Status`` objects with the real codes (401, 404, 409).
  A new pod is ``Pending`` until it is first read, then ``Running``.
* ``/api/v1/namespaces/{ns}/pods/{name}/exec``: the exec websocket, subprotocols ``v5.channel.k8s.io`` and
  ``v4.channel.k8s.io`` (one byte of channel before every frame: 0 stdin, 1 stdout, 2 stderr, 3 the exit status as
  a ``Status`` object; v5's ``[255, channel]`` closes a channel). Closing the stream ends the command.
* ``/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies``: create, list, delete. The policy is honoured: a
  pod's only egress is the single ``ipBlock``/port its policies allow, reached inside the pod at
  ``http://127.0.0.1:3128`` (the local backend's relay), or none at all.
* Bearer-token authentication, as a kubeconfig user token.

Each pod's "container" is a sandbox of the local backend (:class:`benchwright.sandbox.local.LocalBackend`), with
the pod's CPU and memory limits as its cgroup limits and the container's ``env``. What it does not do: scheduling,
images (every pod runs this host's userland), watches, status conditions, admission, RBAC.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from benchwright.sandbox.base import ExecLimits
from benchwright.sandbox.local import ROOT_LINKS_KEY, LocalBackend, LocalProcess

V5, V4 = "v5.channel.k8s.io", "v4.channel.k8s.io"
_POD_WALL_S = 24 * 3600


@dataclass
class _Pod:
    obj: dict[str, Any]
    backend: LocalBackend
    sandbox_id: str
    limits: ExecLimits
    env: dict[str, str]
    reads: int = 0
    procs: set[LocalProcess] = field(default_factory=set)


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": reason, "code": code}, status=code)


def _cpu(q: str) -> float:
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def _mib(q: str) -> int:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024, "K": 1000 / 1024 / 1024,
             "M": 1000 * 1000 / 1024 / 1024, "G": 1000 ** 3 / 1024 / 1024}
    for suffix, factor in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if q.endswith(suffix):
            return max(1, int(float(q[: -len(suffix)]) * factor))
    return max(1, int(int(q) / 1024 / 1024))


def _matches(selector: str | None, labels: dict[str, str]) -> bool:
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value.lstrip("="):
            return False
    return True


class K8sDouble:
    """The API server double on ``127.0.0.1:<free port>`` (see the module docstring).

    Args:
        root: Where the pods' local sandboxes live.
        protocols: Exec subprotocols offered, preferred first (``(V4,)`` tests a v4-only server).
        images: Image -> top-level directories its pods' user owns (``["logs", "tests", "app"]``: links into the
            work directory, the local backend's ``root_links``, made when the pod starts); other images have none.
        local_options: Passed to every pod's :class:`LocalBackend` (``allow_unisolated``, ``isolation``...).
    """

    def __init__(self, root: Path, *, protocols: tuple[str, ...] = (V5, V4),
                 images: Mapping[str, Sequence[str]] | None = None, **local_options: Any) -> None:
        self.root, self.protocols, self.local_options = Path(root), protocols, local_options
        self.images = {k: list(v) for k, v in (images or {}).items()}
        self.token = secrets.token_hex(16)
        self.pods: dict[tuple[str, str], _Pod] = {}
        self.policies: dict[tuple[str, str], dict[str, Any]] = {}
        self.exec_protocols: list[str] = []
        """The subprotocol of every exec stream opened, in order (tests assert which was negotiated)."""
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application(middlewares=[self._auth], client_max_size=1 << 30)
        pods = "/api/v1/namespaces/{ns}/pods"
        policies = "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"
        app.router.add_post(pods, self._create_pod)
        app.router.add_get(pods, self._list_pods)
        app.router.add_get(pods + "/{name}", self._read_pod)
        app.router.add_delete(pods + "/{name}", self._delete_pod)
        app.router.add_route("*", pods + "/{name}/exec", self._exec)
        app.router.add_post(policies, self._create_policy)
        app.router.add_get(policies, self._list_policies)
        app.router.add_delete(policies + "/{name}", self._delete_policy)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        for pod in list(self.pods.values()):
            await self._destroy(pod)
        self.pods.clear()
        if self._runner is not None:
            await self._runner.cleanup()

    def kubeconfig(self, path: Path, *, namespace: str = "default") -> Path:
        """A kubeconfig file pointing at this server with its token (what ``sandbox0_kubeconfig`` names)."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "double",
            "clusters": [{"name": "double", "cluster": {"server": self.url}}],
            "users": [{"name": "double", "user": {"token": self.token}}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "double",
                                                        "namespace": namespace}}]}))
        return path

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        result: web.StreamResponse = await handler(request)
        return result

    # -- network policies ---------------------------------------------------------------------------------------

    async def _create_policy(self, request: web.Request) -> web.Response:
        ns, body = request.match_info["ns"], await request.json()
        name = body["metadata"]["name"]
        if (ns, name) in self.policies:
            return _status(409, "AlreadyExists", f'networkpolicies "{name}" already exists')
        body["metadata"].update({"namespace": ns, "uid": secrets.token_hex(8)})
        self.policies[(ns, name)] = body
        return web.json_response(body, status=201)

    async def _list_policies(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        items = [p for (n, _), p in self.policies.items() if n == ns
                 and _matches(request.query.get("labelSelector"), p["metadata"].get("labels") or {})]
        return web.json_response({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicyList",
                                  "metadata": {}, "items": items})

    async def _delete_policy(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        if key not in self.policies:
            return _status(404, "NotFound", f'networkpolicies "{key[1]}" not found')
        self.policies.pop(key)
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}})

    def _egress_for(self, ns: str, labels: dict[str, str]) -> str | None:
        """The one endpoint the pod's policies let it reach, as a proxy URL; None (no egress) otherwise."""
        targets = set()
        for (n, _), policy in self.policies.items():
            spec = policy.get("spec", {})
            if n != ns or not all(labels.get(k) == v for k, v in
                                  (spec.get("podSelector", {}).get("matchLabels") or {}).items()):
                continue
            for rule in spec.get("egress") or []:
                for to in rule.get("to") or []:
                    cidr = (to.get("ipBlock") or {}).get("cidr", "")
                    for port in rule.get("ports") or []:
                        if cidr.endswith("/32"):
                            targets.add(f"http://{cidr[:-3]}:{port['port']}")
        return targets.pop() if len(targets) == 1 else None

    # -- pods ---------------------------------------------------------------------------------------------------

    async def _create_pod(self, request: web.Request) -> web.Response:
        ns, body = request.match_info["ns"], await request.json()
        meta, spec = body.get("metadata") or {}, body.get("spec") or {}
        name, containers = meta.get("name"), spec.get("containers") or []
        if not name or len(containers) != 1:
            return _status(422, "Invalid", "the double wants a named pod with exactly one container")
        if (ns, name) in self.pods:
            return _status(409, "AlreadyExists", f'pods "{name}" already exists')
        limits = (containers[0].get("resources") or {}).get("limits") or {}
        exec_limits = ExecLimits(cpu_seconds=_POD_WALL_S, memory_mb=_mib(limits.get("memory", "1Gi")),
                                 wall_seconds=_POD_WALL_S, max_processes=512, max_file_mb=1 << 20,
                                 cpu_cores=_cpu(limits.get("cpu", "1")))
        labels = meta.get("labels") or {}
        backend = LocalBackend(self.root, egress_proxy_url=self._egress_for(ns, labels), **self.local_options)
        dirs = self.images.get(str(containers[0].get("image", "")), [])
        info = await backend.create(role=labels.get("benchwright_role", "work"),
                                    run_id=labels.get("benchwright/run-id", "double"),
                                    metadata={ROOT_LINKS_KEY: dirs} if dirs else None)
        if dirs:
            await backend.exec(info.sandbox_id, ["mkdir", "-p", *dirs], env={"PATH": "/usr/bin:/bin"}, timeout_s=30,
                               limits=exec_limits)
        meta.update({"namespace": ns, "uid": secrets.token_hex(8),
                     "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        body["status"] = {"phase": "Pending"}
        env = {e["name"]: e.get("value", "") for e in containers[0].get("env") or []}
        self.pods[(ns, name)] = _Pod(obj=body, backend=backend, sandbox_id=info.sandbox_id, limits=exec_limits,
                                     env=env)
        return web.json_response(body, status=201)

    def _pod(self, request: web.Request) -> _Pod | None:
        return self.pods.get((request.match_info["ns"], request.match_info["name"]))

    async def _read_pod(self, request: web.Request) -> web.Response:
        pod = self._pod(request)
        if pod is None:
            return _status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        pod.reads += 1
        if pod.reads > 1:
            pod.obj["status"] = {"phase": "Running", "podIP": "127.0.0.1"}
        return web.json_response(pod.obj)

    async def _list_pods(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        items = [p.obj for (n, _), p in self.pods.items()
                 if n == ns and _matches(request.query.get("labelSelector"), p.obj["metadata"].get("labels") or {})]
        return web.json_response({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})

    async def _delete_pod(self, request: web.Request) -> web.Response:
        pod = self.pods.pop((request.match_info["ns"], request.match_info["name"]), None)
        if pod is None:
            return _status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        await self._destroy(pod)
        return web.json_response(pod.obj)

    async def _destroy(self, pod: _Pod) -> None:
        for proc in list(pod.procs):
            proc.kill()
        await pod.backend.kill(pod.sandbox_id)
        await pod.backend.close()

    # -- exec ---------------------------------------------------------------------------------------------------

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        pod = self._pod(request)
        if pod is None:
            return _status(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
        command = request.query.getall("command", [])
        if not command:
            return _status(400, "BadRequest", "you must specify at least 1 command")
        ws = web.WebSocketResponse(protocols=self.protocols, max_msg_size=1 << 30)
        await ws.prepare(request)
        self.exec_protocols.append(ws.ws_protocol or "")
        try:
            proc = await pod.backend.spawn(pod.sandbox_id, command, env=pod.env, limits=pod.limits)
        except Exception as exc:  # noqa: BLE001 - reported to the client as the runtime would
            await ws.send_bytes(b"\x03" + json.dumps({"metadata": {}, "status": "Failure", "message": str(exc),
                                                      "reason": "InternalError"}).encode())
            await ws.close()
            return ws
        pod.procs.add(proc)
        pumps = [asyncio.create_task(self._pump(proc.stdout, ws, 1)),
                 asyncio.create_task(self._pump(proc.stderr, ws, 2))]
        reader = asyncio.create_task(self._stdin(ws, proc))
        try:
            rc = await proc.wait()
            await asyncio.gather(*pumps, return_exceptions=True)
            code = 128 - rc if rc < 0 else rc  # a signal death, as container runtimes report it
            status = {"metadata": {}, "status": "Success"} if code == 0 else {
                "metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
                "message": f"command terminated with non-zero exit code: exit status {code}",
                "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_bytes(b"\x03" + json.dumps(status).encode())
                await ws.close()
        finally:
            reader.cancel()
            for task in pumps:
                task.cancel()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            pod.procs.discard(proc)
        return ws

    @staticmethod
    async def _pump(stream: asyncio.StreamReader | None, ws: web.WebSocketResponse, channel: int) -> None:
        assert stream is not None
        while chunk := await stream.read(1 << 16):
            await ws.send_bytes(bytes([channel]) + chunk)

    async def _stdin(self, ws: web.WebSocketResponse, proc: LocalProcess) -> None:
        assert proc.stdin is not None
        async for msg in ws:
            if msg.type not in (WSMsgType.BINARY, WSMsgType.TEXT):
                break
            data = msg.data if isinstance(msg.data, bytes) else msg.data.encode()
            if data[:1] == b"\x00" and not proc.stdin.is_closing():
                with contextlib.suppress(ConnectionError):
                    proc.stdin.write(data[1:])
                    await proc.stdin.drain()
            elif data[:2] == b"\xff\x00" and ws.ws_protocol == V5:
                proc.stdin.close()
        if proc.returncode is None:  # the client closed the stream: the command ends with it
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
