"""The ``e2b`` backend: E2B micro-VMs through the ``e2b`` SDK (``AsyncSandbox``).

* **Create**: ``AsyncSandbox.create`` from a template (the configured one, or ``metadata["template"]``), with
  metadata (``benchwright_role``, ``benchwright_run_id``, ``benchwright_managed``, the creation time, instance size
  and template: what ``reap`` reads back after a crash), a lifetime (``timeout``) and a network that allows only the
  egress proxy (``deny_out`` everything else) or nothing.
* **Commands** through the SDK (``commands.run(background=True, stdin=True)``: envd's ``Process.Start`` stream,
  ``SendInput``/``CloseStdin``/``SendSignal``), wrapped by :func:`benchwright.sandbox.remote.wrap_command` for the
  limits. envd hands output to the SDK as text (UTF-8, undecodable bytes replaced), so binary data never travels
  on a command's stdout here: files go through the file API.
* **Files** through ``files.read``/``files.write`` under the work directory (``/home/user``).
* **Snapshots**: a tarball of the work directory (made in the sandbox, read through the file API) in the blob
  store; the id is the blob id. (E2B's pause/resume keeps one sandbox; a fanout needs copies, so tarballs.)
* **Kill** is ``AsyncSandbox.kill``; **reap** lists by metadata.

Configured by an API key (``BENCHWRIGHT_E2B_API_KEY``) and a template. Tested with the real SDK (e2b >= 2.57) against
:mod:`benchwright.testkit.e2b_double` (its ``api_url``/``sandbox_url`` options point the SDK at the double).
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
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
    parse_instance_size,
    snapshot_archive,
    tar_of,
)

if TYPE_CHECKING:
    from e2b import SandboxNetworkOpts

WORKDIR = "/home/user"
_SNAPSHOT_FILE = ".benchwright-snapshot.tar"
_IO_LIMITS = ExecLimits(cpu_seconds=600, memory_mb=1 << 20, wall_seconds=600, max_processes=64, max_file_mb=1 << 20)
_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


class E2BBackend(WrappedCommands):
    """Sandboxes as E2B micro-VMs (see the module docstring).

    Args:
        api_key: The E2B API key.
        blobs: Where snapshots go.
        template: The E2B template (needs ``sh``, coreutils, ``tar`` and ``python3``).
        instance_size: ``e2b-<cpus>cpu-<gb>gb``, the template's size: billing, and the memory the limits wrapper
            compares against.
        lifetime_s: E2B kills a sandbox this long after creation if nobody does first.
        egress_proxy_url: The one address a sandbox may reach; without it, none.
        api_url, sandbox_url: Where the SDK sends REST and envd calls (None: E2B's own; the double's in tests).
    """

    name = "e2b"

    def __init__(self, *, api_key: str, blobs: BlobStore, template: str = "base",
                 instance_size: str = "e2b-2cpu-2gb", lifetime_s: int = 6 * 3600,
                 egress_proxy_url: str | None = None, api_url: str | None = None,
                 sandbox_url: str | None = None) -> None:
        self.blobs, self.template, self.lifetime_s = blobs, template, lifetime_s
        self.cpus, self.memory_mb = parse_instance_size(instance_size)
        self.instance_size = instance_size
        self.egress_proxy_url = egress_proxy_url
        self.limit_mechanism = (f"E2B micro-VM ({self.cpus:g} cpu, {self.memory_mb} MiB) + per-command ulimit "
                                "(-t, -f, -u, -v below the VM's memory) and coreutils timeout")
        # HTTP/1.1: envd streams work over it everywhere (the double is HTTP/1.1 only; on E2B it avoids long-lived
        # HTTP/2 connections that intermediaries retire, the case the SDK's option exists for).
        self._opts: dict[str, Any] = {"api_key": api_key, "http_version": "1.1"}
        for option, value in (("api_url", api_url), ("sandbox_url", sandbox_url)):
            if value:
                self._opts[option] = value
        self._boxes: dict[str, Any] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def _keep(self, task: asyncio.Task[Any]) -> None:
        """Hold a fire-and-forget task until it ends (the loop keeps only weak references)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _network(self) -> SandboxNetworkOpts:
        """Egress to the proxy's host only (none without one)."""
        allow = [urlsplit(self.egress_proxy_url).hostname] if self.egress_proxy_url else []
        return {"allow_out": [a for a in allow if a], "deny_out": ["0.0.0.0/0"]}

    async def create(self, *, role: str, run_id: str, snapshot_id: str | None = None,
                     metadata: Mapping[str, Any] | None = None) -> SandboxInfo:
        from e2b import AsyncSandbox

        archive = await snapshot_archive(self.blobs, role, snapshot_id)
        options = dict(metadata or {})
        template = str(options.pop(TEMPLATE_KEY, None) or self.template)
        meta = {**{k: str(v) for k, v in options.items()}, "benchwright_role": role,
                "benchwright_run_id": run_id, "benchwright_managed": "1", "benchwright_created_at": repr(time.time()),
                "benchwright_instance_size": self.instance_size, "benchwright_template": template}
        try:
            box = await AsyncSandbox.create(template=template, timeout=self.lifetime_s, metadata=meta,
                                            network=self._network(), **self._opts)
        except Exception as exc:  # the SDK's exceptions: the sandbox was not made
            raise SandboxError(f"E2B could not create a sandbox: {exc}") from exc
        self._boxes[box.sandbox_id] = box
        try:
            if archive is not None:
                await self._untar(box.sandbox_id, archive)
        except BaseException:
            await asyncio.shield(self.kill(box.sandbox_id))
            raise
        return self._info(box.sandbox_id, meta)

    def _info(self, sandbox_id: str, meta: Mapping[str, str]) -> SandboxInfo:
        metadata: dict[str, Any] = dict(meta)
        metadata.update({"isolation": "microvm", "limits": self.limit_mechanism, "workdir": WORKDIR})
        if self.egress_proxy_url:
            metadata["egress_proxy"] = self.egress_proxy_url
        return SandboxInfo(sandbox_id=sandbox_id, role=meta.get("benchwright_role", ""), backend=self.name,
                           created_at=float(meta.get("benchwright_created_at", "0")), metadata=metadata, root=None,
                           instance_size=meta.get("benchwright_instance_size", self.instance_size))

    async def _box(self, sandbox_id: str) -> Any:
        from e2b import AsyncSandbox

        box = self._boxes.get(sandbox_id)
        if box is None:
            try:
                box = await AsyncSandbox.connect(sandbox_id, **self._opts)
            except Exception as exc:  # noqa: BLE001 - NotFoundException and the SDK's other refusals
                raise SandboxNotFound(f"no live sandbox {sandbox_id!r}: {exc}") from None
            self._boxes[sandbox_id] = box
        return box

    async def kill(self, sandbox_id: str) -> float:
        from e2b import AsyncSandbox

        created = next((i.created_at for i in await self.list_alive() if i.sandbox_id == sandbox_id), None)
        self._boxes.pop(sandbox_id, None)
        if created is None:
            return 0.0
        await AsyncSandbox.kill(sandbox_id, **self._opts)
        return max(0.0, time.time() - created)

    async def list_alive(self) -> list[SandboxInfo]:
        from e2b import AsyncSandbox
        from e2b.sandbox.sandbox_api import SandboxQuery

        pager = AsyncSandbox.list(query=SandboxQuery(metadata={"benchwright_managed": "1"}), **self._opts)
        found: list[SandboxInfo] = []
        while True:
            found += [self._info(s.sandbox_id, s.metadata or {}) for s in await pager.next_items()]
            if not pager.has_next:
                return found

    async def reap(self, is_orphan: Callable[[SandboxInfo], bool]) -> list[str]:
        from e2b import AsyncSandbox

        reaped = []
        for info in await self.list_alive():
            if is_orphan(info) and await AsyncSandbox.kill(info.sandbox_id, **self._opts):
                self._boxes.pop(info.sandbox_id, None)
                reaped.append(info.sandbox_id)
        return reaped

    async def close(self) -> None:
        self._boxes.clear()

    # -- commands -----------------------------------------------------------------------------------------------

    async def _start(self, sandbox_id: str, command: list[str], *, wall_seconds: float) -> RemoteProcess:
        box = await self._box(sandbox_id)
        loop = asyncio.get_running_loop()
        holder: dict[str, RemoteProcess] = {}
        early: list[tuple[str, str]] = []

        def on(stream: str) -> Callable[[str], None]:
            def feed(text: str) -> None:
                proc = holder.get("p")
                if proc is None:
                    early.append((stream, text))
                elif stream == "out":
                    proc.feed_stdout(text.encode())
                else:
                    proc.feed_stderr(text.encode())
            return feed

        try:
            handle = await box.commands.run(shlex.join(command), background=True, stdin=True, cwd=WORKDIR,
                                            timeout=0, on_stdout=on("out"), on_stderr=on("err"))
        except Exception as exc:  # the SDK's exceptions: it did not start
            raise SandboxError(f"cannot start a command in {sandbox_id}: {exc}") from exc

        # Input goes out in order, one call at a time (concurrent SendInput calls could overtake each other).
        inbox: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def deliver() -> None:
            try:
                while (data := await inbox.get()) is not None:
                    await box.commands.send_stdin(handle.pid, data)
                await box.commands.close_stdin(handle.pid)
            except Exception:  # noqa: BLE001 - the process ended (NotFoundException) or its stream broke
                return

        sender = loop.create_task(deliver())

        def cancel() -> None:
            sender.cancel()
            self._keep(loop.create_task(box.commands.kill(handle.pid)))

        proc = RemoteProcess(pid=handle.pid, send=inbox.put_nowait, close_stdin=lambda: inbox.put_nowait(None),
                             cancel=cancel,
                             wall_seconds=wall_seconds)
        holder["p"] = proc
        for stream, text in early:
            (proc.feed_stdout if stream == "out" else proc.feed_stderr)(text.encode())

        async def watch() -> None:
            from e2b import CommandExitException

            try:
                result = await handle.wait()
                proc.finish(result.exit_code)
            except CommandExitException as exc:
                proc.finish(exc.exit_code)
            except Exception:  # noqa: BLE001 - the stream broke: no exit status (sandbox_killed)
                proc.finish(None)
            finally:
                sender.cancel()

        self._keep(loop.create_task(watch()))
        return proc

    # -- files and snapshots ------------------------------------------------------------------------------------

    async def write_file(self, sandbox_id: str, path: str, data: bytes, *, mode: int = 0o644) -> None:
        rel = check_relpath(path)
        box = await self._box(sandbox_id)
        await box.files.write(f"{WORKDIR}/{rel}", data, use_octet_stream=True)
        if mode != 0o644:
            await self._io(sandbox_id, ["chmod", oct(mode)[2:], "--", rel])

    async def read_file(self, sandbox_id: str, path: str) -> bytes:
        from e2b.exceptions import NotFoundException  # FileNotFoundException derives from it

        rel = check_relpath(path)
        box = await self._box(sandbox_id)
        check = await self._io(sandbox_id, ["sh", "-c", 'test -L "$1" && echo link', "sh", rel])
        if check.stdout.strip() == b"link":
            from benchwright.sandbox.base import SandboxPathError

            raise SandboxPathError(f"path {path!r} is a link; links are not followed out of the work directory")
        try:
            data: bytes = bytes(await box.files.read(f"{WORKDIR}/{rel}", format="bytes"))
        except NotFoundException:
            raise FileNotFoundError(path) from None
        return data

    async def _io(self, sandbox_id: str, argv: list[str]) -> ExecResult:
        return await self.exec(sandbox_id, argv, env=_ENV, timeout_s=_IO_LIMITS.wall_seconds, limits=_IO_LIMITS)

    async def _untar(self, sandbox_id: str, archive: bytes) -> None:
        box = await self._box(sandbox_id)
        await box.files.write(f"{WORKDIR}/{_SNAPSHOT_FILE}", archive, use_octet_stream=True)
        unpack = f"tar -xf {_SNAPSHOT_FILE} --no-same-owner; rc=$?; rm -f {_SNAPSHOT_FILE}; exit $rc"
        res = await self._io(sandbox_id, ["sh", "-c", unpack])
        if res.returncode != 0:
            raise SandboxError(f"cannot unpack files into {sandbox_id}: {res.stderr.decode()[-500:]}")

    async def snapshot(self, sandbox_id: str, *, label: str) -> str:
        res = await self._io(sandbox_id, ["tar", "-cf", _SNAPSHOT_FILE, f"--exclude=./{_SNAPSHOT_FILE}", "."])
        if res.returncode != 0:
            raise SandboxError(f"cannot snapshot {sandbox_id} ({label}): {res.stderr.decode()[-500:]}")
        box = await self._box(sandbox_id)
        try:
            archive = bytes(await box.files.read(f"{WORKDIR}/{_SNAPSHOT_FILE}", format="bytes"))
        finally:
            await self._io(sandbox_id, ["rm", "-f", _SNAPSHOT_FILE])
        return await self.blobs.put(archive)

    async def snapshot_files(self, files: Mapping[str, bytes], *, label: str, base: str | None = None) -> str:
        return await self.blobs.put(tar_of(files, base=await self.blobs.get(base) if base else None))

