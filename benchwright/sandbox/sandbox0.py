"""The ``sandbox0`` backend: a Kubernetes pod per sandbox, through the official ``kubernetes`` client.

* **Create**: a NetworkPolicy selecting the pod (ingress: none; egress: only the egress proxy's address and port, or
  nothing), then a pod (``restartPolicy: Never``, no service-account token, no service links) whose one container
  idles (``sleep infinity``) in the work directory; requests = limits = the instance size's CPU and memory
  (``sandbox0-<cpus>cpu-<gb>gb``). Labels carry what ``reap`` needs after a crash: ``benchwright_role``,
  ``benchwright/run-id``, ``benchwright/account``, ``app.kubernetes.io/managed-by=benchwright``; annotations the
  creation time, the instance size and the free-form metadata. ``create`` returns once the pod is Running.
* **Commands** go over the exec websocket (``v5.channel.k8s.io``, else ``v4``: channel-framed stdin/stdout/stderr,
  the exit status on channel 3), wrapped by :func:`benchwright.sandbox.remote.wrap_command` for the limits. The
  client is synchronous (websocket-client), so each command's stream is pumped by a thread of its own and handed to
  the event loop.
* **Files** in and out as tar over exec (``tar -xf -`` / ``tar -cf - path``), as ``kubectl cp`` does.
* **Snapshots**: ``tar -cf - .`` of the work directory into the blob store; the id is the blob id, and ``create``
  restores it by streaming it back through ``tar -xf -``.
* **Kill** deletes the pod (grace 0) and its NetworkPolicy; **reap** lists pods by the managed-by label.

Configured by a kubeconfig (``BENCHWRIGHT_SANDBOX0_KUBECONFIG``) or the in-cluster service account, a namespace
and an image (which must have ``sh``, coreutils ``timeout``/``head``/``env``, ``tar`` and ``python3``; the configured
one, or ``metadata["template"]`` of ``create``).

Tested with the real client against :mod:`benchwright.testkit.k8s_double`, a loopback API server speaking the same
REST and exec websocket protocol; see docs/backends.md for running the same suite against a real cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from benchwright.data.blobs import BlobStore
from benchwright.sandbox.base import (
    TEMPLATE_KEY,
    ExecLimits,
    ExecResult,
    SandboxError,
    SandboxInfo,
    SandboxNotFound,
)
from benchwright.sandbox.remote import (
    RemoteProcess,
    WrappedCommands,
    check_relpath,
    file_from_tar,
    parse_instance_size,
    snapshot_archive,
    tar_of,
)

MANAGED = {"app.kubernetes.io/managed-by": "benchwright"}
_READY_TIMEOUT_S = 300.0
_IO_LIMITS = ExecLimits(cpu_seconds=600, memory_mb=1 << 20, wall_seconds=600, max_processes=64,
                        max_output_bytes=4 << 30, max_file_mb=1 << 20)
_POD_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
_STOP = object()


def load_api_client(kubeconfig: str | None) -> Any:
    """A ``kubernetes.client.ApiClient`` from ``kubeconfig`` (a path), else the in-cluster service account."""
    from kubernetes import client, config  # type: ignore[import-untyped]

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    return client.ApiClient(configuration)


def _label_value(value: str) -> str:
    """A Kubernetes label value (<= 63 of ``[A-Za-z0-9._-]``, alphanumeric at both ends)."""
    cleaned = "".join(c if c.isalnum() or c in "._-" else "_" for c in value)[:63]
    return cleaned.strip("._-") or "none"


class Sandbox0Backend(WrappedCommands):
    """Sandboxes as Kubernetes pods (see the module docstring).

    Args:
        api_client: A ``kubernetes.client.ApiClient`` (:func:`load_api_client`).
        namespace: Where pods and NetworkPolicies go.
        image: The sandbox image.
        blobs: Where snapshots go.
        instance_size: ``sandbox0-<cpus>cpu-<gb>gb``: the pod's CPU/memory requests and limits, and its billing.
        egress_proxy_url: ``http://HOST:PORT`` of the egress proxy as pods reach it; the NetworkPolicy allows that
            address and port only. Without it pods get no egress at all.
        pod_egress_url: The proxy URL the pod's commands use (``metadata["egress_proxy"]``), when it differs from
            ``egress_proxy_url`` (a sidecar on 127.0.0.1; the test double's pods).
        workdir: The work directory in the container.
    """

    name = "sandbox0"

    def __init__(self, *, api_client: Any, namespace: str, image: str, blobs: BlobStore,
                 instance_size: str = "sandbox0-2cpu-4gb", egress_proxy_url: str | None = None,
                 pod_egress_url: str | None = None, workdir: str = "/sandbox") -> None:
        from kubernetes import client

        self._api = api_client
        self._core = client.CoreV1Api(api_client)
        self._net = client.NetworkingV1Api(api_client)
        self.namespace, self.image, self.blobs, self.workdir = namespace, image, blobs, workdir
        self.cpus, self.memory_mb = parse_instance_size(instance_size)
        self.instance_size = instance_size
        self.egress_proxy_url = egress_proxy_url
        self.pod_egress_url = pod_egress_url or egress_proxy_url
        self.limit_mechanism = (f"pod resources (cpu {self.cpus:g}, memory {self.memory_mb} MiB) + per-command "
                                "ulimit (-t, -f, -u, -v below the pod's memory) and coreutils timeout")
        self._pids = itertools.count(1)

    # -- create / kill ------------------------------------------------------------------------------------------

    def _egress_rule(self) -> list[dict[str, Any]]:
        if not self.egress_proxy_url:
            return []
        parts = urlsplit(self.egress_proxy_url)
        if not parts.hostname or not parts.port:
            raise SandboxError(f"egress proxy URL {self.egress_proxy_url!r} has no host:port")
        ip = socket.gethostbyname(parts.hostname)
        return [{"to": [{"ipBlock": {"cidr": f"{ip}/32"}}], "ports": [{"protocol": "TCP", "port": parts.port}]}]

    def _manifests(self, name: str, *, role: str, run_id: str, metadata: Mapping[str, Any],
                   image: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        labels = {**MANAGED, "benchwright/sandbox": name, "benchwright_role": role,
                  "benchwright/run-id": _label_value(run_id),
                  "benchwright/account": _label_value(str(metadata.get("account", "none")))}
        annotations = {"benchwright/created-at": repr(time.time()), "benchwright/instance-size": self.instance_size,
                       "benchwright/run-id": run_id, "benchwright/metadata": json.dumps(dict(metadata))}
        quantity = {"cpu": f"{self.cpus:g}", "memory": f"{self.memory_mb}Mi"}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "labels": labels, "annotations": annotations},
               "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                        "enableServiceLinks": False, "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "sandbox", "image": image or self.image,
                                        "command": ["sleep", "infinity"],
                                        "workingDir": self.workdir,
                                        "env": [{"name": k, "value": v} for k, v in _POD_ENV.items()],
                                        "resources": {"requests": quantity, "limits": quantity}}]}}
        policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                  "metadata": {"name": name, "labels": {**MANAGED, "benchwright/sandbox": name}},
                  "spec": {"podSelector": {"matchLabels": {"benchwright/sandbox": name}},
                           "policyTypes": ["Ingress", "Egress"], "ingress": [], "egress": self._egress_rule()}}
        return pod, policy

    async def create(self, *, role: str, run_id: str, snapshot_id: str | None = None,
                     metadata: Mapping[str, Any] | None = None) -> SandboxInfo:
        """A pod for a sandbox, Running, with ``snapshot_id``'s files in its work directory when given."""
        archive = await snapshot_archive(self.blobs, role, snapshot_id)
        name = f"bw-{role.replace('_', '-')}-{secrets.token_hex(6)}"
        options = dict(metadata or {})
        image = str(options.pop(TEMPLATE_KEY, None) or self.image)
        meta = {**options, "benchwright_role": role, "benchwright_run_id": run_id, "benchwright_image": image}
        pod, policy = self._manifests(name, role=role, run_id=run_id, metadata=meta, image=image)
        try:
            await asyncio.to_thread(self._net.create_namespaced_network_policy, self.namespace, policy)
            created = await asyncio.to_thread(self._core.create_namespaced_pod, self.namespace, pod)
            await self._wait_running(name)
            if archive is not None:
                await self._untar(name, archive)
        except BaseException:
            await asyncio.shield(self._delete(name))
            raise
        return self._info(created)

    async def _wait_running(self, name: str) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        delay = 0.05
        while True:
            pod = await asyncio.to_thread(self._core.read_namespaced_pod, name, self.namespace)
            phase = pod.status.phase if pod.status else None
            if phase == "Running":
                return
            if phase in ("Failed", "Succeeded") or time.monotonic() > deadline:
                reason = pod.status.message if pod.status and pod.status.message else phase
                raise SandboxError(f"pod {name} did not start ({reason})")
            await asyncio.sleep(delay)  # polling the API server for the pod's phase, bounded by the deadline
            delay = min(1.0, delay * 2)

    def _info(self, pod: Any) -> SandboxInfo:
        labels = pod.metadata.labels or {}
        notes = pod.metadata.annotations or {}
        metadata: dict[str, Any] = json.loads(notes.get("benchwright/metadata", "{}"))
        metadata.update({"isolation": "pod", "limits": self.limit_mechanism, "namespace": self.namespace,
                         "workdir": self.workdir})
        if self.pod_egress_url:
            metadata["egress_proxy"] = self.pod_egress_url
        return SandboxInfo(sandbox_id=pod.metadata.name, role=labels.get("benchwright_role", ""), backend=self.name,
                           created_at=float(notes.get("benchwright/created-at", "0")), metadata=metadata, root=None,
                           instance_size=notes.get("benchwright/instance-size", self.instance_size))

    async def _delete(self, name: str) -> bool:
        from kubernetes.client.exceptions import ApiException  # type: ignore[import-untyped]

        found = False
        for call in (self._core.delete_namespaced_pod, self._net.delete_namespaced_network_policy):
            try:
                await asyncio.to_thread(call, name, self.namespace, grace_period_seconds=0)
                found = found or call == self._core.delete_namespaced_pod
            except ApiException as exc:
                if exc.status != 404:
                    raise SandboxError(f"cannot delete {name}: {exc.reason}") from exc
        return found

    async def kill(self, sandbox_id: str) -> float:
        """Delete the pod and its NetworkPolicy; returns its lifetime (0 if it was already gone)."""
        try:
            info = self._info(await self._read(sandbox_id))
        except SandboxNotFound:
            return 0.0
        await self._delete(sandbox_id)
        return max(0.0, time.time() - info.created_at)

    async def _read(self, name: str) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            pod = await asyncio.to_thread(self._core.read_namespaced_pod, name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                raise SandboxNotFound(f"no live sandbox {name!r}") from None
            raise SandboxError(f"cannot read pod {name}: {exc.reason}") from exc
        if pod.metadata.deletion_timestamp or (pod.status and pod.status.phase in ("Failed", "Succeeded")):
            raise SandboxNotFound(f"no live sandbox {name!r}")
        return pod

    async def list_alive(self) -> list[SandboxInfo]:
        selector = ",".join(f"{k}={v}" for k, v in MANAGED.items())
        pods = await asyncio.to_thread(self._core.list_namespaced_pod, self.namespace, label_selector=selector)
        return [self._info(p) for p in pods.items
                if not p.metadata.deletion_timestamp and p.status and p.status.phase in ("Pending", "Running")]

    async def reap(self, is_orphan: Callable[[SandboxInfo], bool]) -> list[str]:
        reaped = []
        for info in await self.list_alive():
            if is_orphan(info) and await self._delete(info.sandbox_id):
                reaped.append(info.sandbox_id)
        return reaped

    async def close(self) -> None:
        await asyncio.to_thread(self._api.close)

    # -- commands -----------------------------------------------------------------------------------------------

    async def _start(self, name: str, command: list[str], *, wall_seconds: float) -> RemoteProcess:
        from kubernetes.stream import stream  # type: ignore[import-untyped]

        await self._read(name)
        try:
            ws = await asyncio.to_thread(stream, self._core.connect_get_namespaced_pod_exec, name, self.namespace,
                                         container="sandbox", command=command, stdin=True, stdout=True,
                                         stderr=True, tty=False, _preload_content=False, binary=True)
        except Exception as exc:  # ApiException, websocket errors: the command did not start
            raise SandboxError(f"cannot exec in pod {name}: {exc}") from exc
        return _ExecStream(ws, pid=next(self._pids), wall_seconds=wall_seconds).process

    async def _io(self, name: str, argv: list[str], stdin: bytes | None = None) -> ExecResult:
        return await self.exec(name, argv, env=_POD_ENV, timeout_s=_IO_LIMITS.wall_seconds, limits=_IO_LIMITS,
                               stdin=stdin)

    # -- files and snapshots ------------------------------------------------------------------------------------

    async def _untar(self, name: str, archive: bytes) -> None:
        res = await self._io(name, ["tar", "-xf", "-", "--no-same-owner"], stdin=archive)
        if res.returncode != 0:
            raise SandboxError(f"cannot unpack files into {name}: {res.stderr.decode(errors='replace')[-500:]}")

    async def write_file(self, sandbox_id: str, path: str, data: bytes, *, mode: int = 0o644) -> None:
        rel = check_relpath(path)
        await self._untar(sandbox_id, tar_of({rel: data}, modes={rel: mode}))

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        rel = check_relpath(path)
        res = await self._io(sandbox_id, ["tar", "-cf", "-", "--", rel])
        if res.returncode != 0 and not res.stdout:
            raise FileNotFoundError(f"{path}: {res.stderr.decode(errors='replace')[-300:]}")
        return file_from_tar(res.stdout, rel)

    async def snapshot(self, sandbox_id: str, *, label: str) -> str:
        res = await self._io(sandbox_id, ["tar", "-cf", "-", "."])
        if res.returncode != 0:
            raise SandboxError(f"cannot snapshot {sandbox_id} ({label}): {res.stderr.decode(errors='replace')}")
        return await self.blobs.put(res.stdout)

    async def snapshot_files(self, files: Mapping[str, bytes], *, label: str, base: str | None = None) -> str:
        return await self.blobs.put(tar_of(files, base=await self.blobs.get(base) if base else None))


class _ExecStream:
    """One exec websocket: a reader thread feeds the process's streams on the event loop; a sender thread writes
    its stdin (websocket-client sends under a lock, so the two never interleave a frame)."""

    def __init__(self, ws: Any, *, pid: int, wall_seconds: float) -> None:
        self.ws = ws
        self.loop = asyncio.get_running_loop()
        self.outbox: queue.Queue[object] = queue.Queue()
        self.stopped = threading.Event()
        self.process = RemoteProcess(pid=pid, send=self.outbox.put, close_stdin=lambda: self.outbox.put(_STOP),
                                     cancel=self._cancel, wall_seconds=wall_seconds)
        threading.Thread(target=self._read, name=f"sandbox0-exec-{pid}", daemon=True).start()
        threading.Thread(target=self._send, name=f"sandbox0-stdin-{pid}", daemon=True).start()

    def _cancel(self) -> None:
        self.stopped.set()
        self.outbox.put(_STOP)
        with contextlib.suppress(Exception):  # closing a broken socket: nothing left to do
            self.ws.close()

    def _send(self) -> None:
        while (item := self.outbox.get()) is not _STOP:
            try:
                assert isinstance(item, bytes)
                for i in range(0, len(item), 1 << 20):  # 1 MiB frames
                    self.ws.write_stdin(item[i:i + (1 << 20)])
            except Exception:  # noqa: BLE001 - the stream is gone; the reader reports how it ended
                return
        if not self.stopped.is_set():
            try:
                self.ws.close_channel(0)  # v5 only (a no-op on v4, where ``head -c`` ends the input)
            except Exception:  # noqa: BLE001
                return

    def _read(self) -> None:
        from kubernetes.stream.ws_client import (  # type: ignore
            ERROR_CHANNEL,
            STDERR_CHANNEL,
            STDOUT_CHANNEL,
        )

        proc = self.process
        rc: int | None = None
        try:
            while self.ws.is_open() and not self.stopped.is_set():
                self.ws.update(timeout=0.5)
                self._drain(STDOUT_CHANNEL, proc.feed_stdout)
                self._drain(STDERR_CHANNEL, proc.feed_stderr)
            self._drain(STDOUT_CHANNEL, proc.feed_stdout)
            self._drain(STDERR_CHANNEL, proc.feed_stderr)
            status = self.ws.read_channel(ERROR_CHANNEL)
            if status and not self.stopped.is_set():
                rc = _exit_code(json.loads(status))
        except Exception:  # noqa: BLE001 - a broken stream: the command ends with no status (sandbox_killed)
            rc = None
        finally:
            self.stopped.set()
            self.outbox.put(_STOP)
            self.loop.call_soon_threadsafe(proc.finish, rc)

    def _drain(self, channel: int, feed: Callable[[bytes], None]) -> None:
        data = self.ws._channels.pop(channel, b"")  # the client's buffer; its read_* would poll the socket again
        if data:
            self.loop.call_soon_threadsafe(feed, bytes(data))


def _exit_code(status: Mapping[str, Any]) -> int:
    """The exit code in an exec's status (channel 3): ``Success``, or ``NonZeroExitCode`` with an ``ExitCode``
    cause."""
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message", "1"))
    raise SandboxError(f"exec failed: {status.get('message') or status}")
