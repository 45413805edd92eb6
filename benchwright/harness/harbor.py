"""The harbor bridge: a harbor task set run by harbor itself, each trial's environment a Benchwright sandbox.

A harbor task is a directory: ``instruction.md``, ``task.toml``, ``environment/`` (how to build its container),
``tests/test.sh`` (the verifier: writes ``/logs/verifier/reward.txt``) and optionally ``solution/solve.sh`` (what the
``oracle`` agent runs). ``harness_config.path`` names one task or a directory of tasks: ``bundled/<set>`` (shipped
here, ``harbor_tasks/``) or a directory under the deployment's harbor task root (``<harness dir>/harbor-tasks``);
nothing else on the host is reachable (``resolve_task_set``).

Materialize runs harbor (its installed venv, mounted read-only) in a ``harbor_orchestrator`` sandbox with a copy of
the tasks. harbor's environment is ``bw_harbor_env.BenchwrightEnvironment`` (its pluggable environment interface),
which asks the worker's ``TaskEnvBroker`` (an HTTP endpoint on the worker's loopback, per-batch key, reached through
the orchestrator's egress proxy) for a ``harbor_task_env`` sandbox per trial and runs harbor's commands and file
transfers in it. There is no Docker engine: ``map_environment`` maps a task's ``environment/`` onto the backend's
template (the host image on the local backend): a Dockerfile of ``FROM`` (any image: the template stands in for
it), ``WORKDIR`` (a top-level directory) and ``ENV`` lines maps; anything that needs a build (``RUN``, ``COPY``,
``ADD``...), a compose file or a prebuilt ``docker_image`` is refused with the line that cannot be mapped, before
harbor starts. harbor's fixed paths (``/logs``, ``/tests``, ``/solution``) and the workdir are top-level symlinks
into the task sandbox's work directory (the local backend's ``root_links``; namespaces isolation only). On a remote
backend (``e2b``, ``sandbox0``) the task sandbox starts from the template mapped to the task's ``FROM`` image, which
must hold those directories (``benchwright.harness.harbor_remote``, ``prepare_remote``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import secrets
import shlex
import tomllib
from collections.abc import Callable, Generator
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from benchwright.errors import InvalidInput
from benchwright.harness.relay import BridgeEndpoint
from benchwright.sandbox import ExecLimits
from benchwright.sandbox.lifecycle import Sandbox
from benchwright.stack.devstack import free_port

BUNDLED = "bundled/"
TASK_ROOT_NAME = "harbor-tasks"
TASKS_DIR = "bw_tasks"
"""Where the orchestrator's copy of the task set lives, relative to its working directory."""
MAX_TASKS = 500
MAX_FILES = 5000
MAX_BYTES = 64 * 1024 * 1024
"""A task set's size bounds (files copied into the orchestrator), and one file transfer's."""
HARBOR_PATHS = ("logs", "tests", "solution")
"""harbor's fixed top-level paths in a task environment (``EnvironmentPaths``)."""
EXEC_TIMEOUT_S = 3600
MAX_LIVE_ENVS = 8
"""Task sandboxes open at once per batch (harbor runs at most 4 trials at a time here, a verifier may need its own)."""
TASK_ENV_LIMITS = ExecLimits(cpu_seconds=3600, memory_mb=2048, wall_seconds=EXEC_TIMEOUT_S, max_processes=256,
                             cpu_cores=1.0)
_WORKDIR = re.compile(r"^/([a-z][a-z0-9_-]{0,31})/?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class Unmappable(InvalidInput):
    """A task's environment cannot be built on this backend (no Docker engine): the message names what."""

    code = "harbor_environment_unmappable"


@dataclass(frozen=True)
class EnvPlan:
    """What a task's environment becomes on the backend: the template plus a workdir and variables."""

    workdir: str
    """A top-level directory (``/app``): a symlink into the task sandbox's work directory on the local backend, a
    directory of the template elsewhere."""
    env: dict[str, str] = field(default_factory=dict)
    image: str | None = None
    """The Dockerfile's (last) ``FROM`` image, None without one; the local backend's host image stands in for any,
    a remote backend needs a template mapped to it (``benchwright.harness.harbor_remote``)."""
    image_line: int = 0
    """The Dockerfile line of that ``FROM`` (for the refusal)."""
    template: str | None = None
    """On a remote backend, the template (E2B template, sandbox0 image) mapped to ``image``; None on the local one."""

    @property
    def root_links(self) -> list[str]:
        top = PurePosixPath(self.workdir).parts[1]
        return sorted({*HARBOR_PATHS, top})


@dataclass(frozen=True)
class TaskSet:
    root: Path
    """The directory ``path`` named (one task, or a directory of tasks)."""
    tasks: list[Path]
    """Task directories in index order (sorted by name; one entry when ``root`` is a task)."""


def bundled_root() -> Path:
    return Path(str(resources.files("benchwright.harness").joinpath("harbor_tasks")))


def resolve_task_set(path: str, *, harness_dir: Path) -> TaskSet:
    """The task directories ``harness_config.path`` names.

    Raises:
        InvalidInput: the path leaves its root (``..``, a symlink out), names nothing, or holds no harbor task.
    """
    if path.startswith(BUNDLED):
        base, rest = bundled_root(), path[len(BUNDLED):]
    else:
        base, rest = harness_dir / TASK_ROOT_NAME, path
    base = base.resolve()
    target = (base / rest).resolve()
    if target != base and base not in target.parents:
        raise InvalidInput(f"harbor path {path!r} leaves its task root", code="invalid_harness_config")
    if not target.is_dir():
        raise InvalidInput(f"harbor path {path!r} is not a directory (bundled sets: "
                           f"{', '.join(sorted(BUNDLED + p.name for p in bundled_root().iterdir() if p.is_dir()))}; "
                           f"other task sets go under {base})", code="invalid_harness_config")
    if (target / "task.toml").is_file():
        return TaskSet(root=target, tasks=[target])
    tasks = sorted(p for p in target.iterdir() if p.is_dir() and not p.is_symlink() and (p / "task.toml").is_file())
    if not tasks:
        raise InvalidInput(f"harbor path {path!r} holds no task (a directory with task.toml, or directories of them)",
                           code="invalid_harness_config")
    if len(tasks) > MAX_TASKS:
        raise InvalidInput(f"harbor path {path!r} holds {len(tasks)} tasks; at most {MAX_TASKS}",
                           code="invalid_harness_config")
    return TaskSet(root=target, tasks=tasks)


def task_files(tasks: TaskSet) -> dict[str, bytes]:
    """Every file of the task set, relative to its root (what the orchestrator gets), within the size bounds.

    Raises:
        InvalidInput: a symlink in the task set, or more than ``MAX_FILES`` files / ``MAX_BYTES`` bytes.
    """
    files: dict[str, bytes] = {}
    total = 0
    for task in tasks.tasks:
        for item in sorted(task.rglob("*")):
            if item.is_symlink():
                raise InvalidInput(f"harbor task {task.name}: {item.relative_to(task)} is a symlink (not carried)",
                                   code="invalid_harness_config")
            if not item.is_file():
                continue
            data = item.read_bytes()
            total += len(data)
            files[item.relative_to(tasks.root).as_posix() if tasks.root != task else
                  f"{task.name}/{item.relative_to(task).as_posix()}"] = data
            if len(files) > MAX_FILES or total > MAX_BYTES:
                raise InvalidInput(f"the harbor task set is larger than {MAX_FILES} files / {MAX_BYTES} bytes",
                                   code="invalid_harness_config")
    return files


def map_environment(task: Path) -> EnvPlan:
    """The task's environment on the backend's template (see the module docstring).

    Raises:
        Unmappable: what cannot be mapped, naming the task, the file and the line.
    """
    name = task.name
    config: dict[str, Any] = {}
    if (task / "task.toml").is_file():
        try:
            config = tomllib.loads((task / "task.toml").read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise Unmappable(f"harbor task {name}: task.toml is not valid TOML: {exc}") from None
    env_config = config.get("environment") or {}
    if env_config.get("docker_image"):
        raise Unmappable(f"harbor task {name}: [environment] docker_image = {env_config['docker_image']!r} cannot be "
                         "mapped: this backend has no image registry or Docker engine (use a Dockerfile of FROM, "
                         "WORKDIR and ENV lines, which maps onto the backend's template)")
    env_dir = task / "environment"
    for compose in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "singularity-compose.yaml"):
        if (env_dir / compose).exists():
            raise Unmappable(f"harbor task {name}: environment/{compose} cannot be mapped: multi-container "
                             "environments need a container engine")
    env = {str(k): str(v) for k, v in (env_config.get("env") or {}).items()}
    workdir = "/app"
    image, image_line = None, 0
    dockerfile = env_dir / "Dockerfile"
    if dockerfile.is_file():
        for number, line in _dockerfile_lines(dockerfile.read_text(errors="replace")):
            word, _, rest = line.partition(" ")
            instruction, rest = word.upper(), rest.strip()
            if instruction == "FROM":  # the backend's template stands in for the base image
                words = [w for w in rest.split() if not w.startswith("--")]
                image, image_line = (words[0] if words else None), number
                continue
            if instruction == "WORKDIR":
                match = _WORKDIR.match(rest)
                if match is None or match.group(1) in _RESERVED:
                    raise Unmappable(f"harbor task {name}: environment/Dockerfile line {number} ({line!r}) cannot "
                                     "be mapped: WORKDIR must be a new top-level directory such as /app")
                workdir = f"/{match.group(1)}"
            elif instruction == "ENV":
                env.update(_env_pairs(rest, task=name, number=number, line=line))
            else:
                raise Unmappable(f"harbor task {name}: environment/Dockerfile line {number} ({line!r}) needs an "
                                 f"image build ({instruction}), and this backend has no Docker engine: only FROM, "
                                 "WORKDIR and ENV map onto its template")
    return EnvPlan(workdir=workdir, env=env, image=image, image_line=image_line)


_RESERVED = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "proc", "tmp", "sandbox",
                       "run", "sys", "root", "boot", *HARBOR_PATHS})


def _dockerfile_lines(text: str) -> Generator[tuple[int, str], None, None]:
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield start, (pending + line).strip()
        pending = ""
    if pending.strip():
        yield start, pending.strip()


def _env_pairs(rest: str, *, task: str, number: int, line: str) -> dict[str, str]:
    try:
        words = shlex.split(rest)
    except ValueError:
        words = []
    if len(words) == 2 and "=" not in words[0]:
        words = [f"{words[0]}={words[1]}"]
    pairs = {}
    for word in words:
        key, eq, value = word.partition("=")
        if not eq or not _ENV_NAME.match(key) or "$" in value:
            raise Unmappable(f"harbor task {task}: environment/Dockerfile line {number} ({line!r}) cannot be mapped: "
                             "ENV takes literal NAME=value pairs here")
        pairs[key] = value
    if not pairs:
        raise Unmappable(f"harbor task {task}: environment/Dockerfile line {number} ({line!r}) sets nothing")
    return pairs


def environment_plans(tasks: TaskSet) -> dict[str, EnvPlan]:
    """Every task's environment, keyed by its ``environment/`` path relative to the task set's root; the first
    task that cannot be mapped refuses the whole run (before harbor starts).

    Raises:
        Unmappable: a task's environment cannot be mapped.
    """
    plans = {}
    for task in tasks.tasks:
        rel = task.relative_to(tasks.root).as_posix() if task != tasks.root else task.name
        plans[f"{rel}/environment".lstrip("./")] = map_environment(task)
    return plans


def sandbox_path(path: str, plan: EnvPlan) -> str:
    """A harbor path in the task environment as the sandbox's commands see it; relative paths are the workdir's.

    Raises:
        InvalidInput: a path outside harbor's directories, the workdir and /tmp (or with ``..``).
    """
    pure = PurePosixPath(path if path.startswith("/") else f"{plan.workdir}/{path}")
    if ".." in pure.parts:
        raise InvalidInput(f"path {path!r} has '..'")
    if (len(pure.parts) >= 2 and pure.parts[1] in plan.root_links) or pure.parts[1:2] == ("tmp",):
        return str(pure)
    raise InvalidInput(f"path {path!r} is outside the task environment's writable directories "
                       f"({', '.join('/' + p for p in plan.root_links)}, /tmp)")


REMOTE_PREPARE = ('pwd; missing=""; for d in "$@"; do mkdir -p "$d" 2>/dev/null; { [ -d "$d" ] && [ -w "$d" ]; } || '
                  'missing="$missing $d"; done; [ -z "$missing" ] || { echo "bw-missing:$missing" >&2; exit 3; }; '
                  'mkdir -p /logs/agent /logs/verifier /logs/artifacts')
"""Prints the remote task sandbox's work directory, then makes harbor's paths (its arguments) or names those the
sandbox user cannot write (exit 3)."""


async def prepare_remote(box: Sandbox, plan: EnvPlan) -> Sandbox:
    """A task sandbox on a remote backend made ready for harbor: its template must have harbor's fixed paths and the
    task's workdir as top-level directories its user can write (they are made when it may create them); returns
    the sandbox with ``home`` = its work directory as its commands see it.

    Raises:
        Unmappable: the template lacks one of them (naming the template and the paths).
    """
    env = box.scorer_env({"HOME": box.home, **plan.env})
    dirs = [f"/{name}" for name in plan.root_links]
    result = await box.backend.exec(box.info.sandbox_id, ["/bin/sh", "-c", REMOTE_PREPARE, "sh", *dirs], env=env,
                                    timeout_s=120, limits=TASK_ENV_LIMITS)
    out = result.stdout.decode(errors="replace") if isinstance(result.stdout, bytes) else str(result.stdout)
    err = result.stderr.decode(errors="replace") if isinstance(result.stderr, bytes) else str(result.stderr)
    if result.returncode != 0 or not out.strip():
        meta = box.info.metadata
        template = meta.get("benchwright_template") or meta.get("benchwright_image") or "?"
        marked = [line for line in err.splitlines() if line.startswith("bw-missing:")]
        missing = marked[-1][len("bw-missing:"):].strip()[:300] if marked and result.returncode == 3 else \
            f"(the check failed: {err.strip()[-300:]})"
        raise Unmappable(f"harbor task environment on {box.backend.name}: the template {template!r} has no "
                         f"directory {missing} its user can write; harbor's fixed paths ({', '.join(dirs)}) must be "
                         "top-level directories of the template writable by its user (there is no Docker engine to "
                         "add them: build them into the template)")
    return dataclasses.replace(box, home=out.strip().splitlines()[0])


OpenEnv = Callable[[str, EnvPlan], AbstractAsyncContextManager[Sandbox]]
"""Opens a ``harbor_task_env`` sandbox for a trial (session id, plan) and kills it on exit."""


@dataclass
class _Live:
    box: Sandbox
    plan: EnvPlan
    stack: AsyncExitStack


TMUX_READY = ("for _ in $(seq 200); do [ -S \"${TMUX_TMPDIR:-/tmp}/tmux-$(id -u)/default\" ] && exit 0; sleep 0.05; "
              "done; echo 'the task environment has no tmux server' >&2; exit 1")
"""Waits (at most 10 s) for the task sandbox's tmux server to listen."""


class TaskEnvBroker:
    """The worker-side end of ``bw_harbor_env``: ``async with TaskEnvBroker(plans, open_env) as (url, key)``.

    Every request carries the per-batch key; an environment id is a fresh random token. Leaving the block kills
    every task sandbox still open (a stopped or failed harness leaves none behind).
    """

    def __init__(self, plans: dict[str, EnvPlan], open_env: OpenEnv, *, tasks_root: str,
                 max_opened: int | None = None, terminal: bool = False) -> None:
        self.plans = plans
        self.open_env = open_env
        self.tasks_root = tasks_root.rstrip("/")
        """Where the harbor process sees the task set (its ``environment_dir`` is under it)."""
        self.key = "bw-harbor-" + secrets.token_urlsafe(24)
        self.live: dict[str, _Live] = {}
        self.opened = 0
        self.max_opened = max_opened
        """At most this many task sandboxes over the batch (two per trial: its environment and a verifier's)."""
        self.terminal = terminal
        """Every task sandbox gets a tmux server of its own (``tmux -D``, a long-lived process of the sandbox), for
        agents that drive a terminal (``terminus-2``): a command run by ``exec`` lives in a PID namespace of its own
        that dies with it, so a ``tmux new-session -d`` would otherwise lose its server when the command returns."""
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    def _plan_for(self, environment_dir: str) -> EnvPlan:
        rel = environment_dir.rstrip("/")
        if rel.startswith(self.tasks_root + "/"):
            rel = rel[len(self.tasks_root) + 1:]
        plan = self.plans.get(rel)
        if plan is None:
            raise InvalidInput(f"{environment_dir!r} is not the environment of a task of this run")
        return plan

    async def _start(self, body: dict[str, Any]) -> dict[str, Any]:
        plan = self._plan_for(str(body.get("environment_dir", "")))
        if len(self.live) >= MAX_LIVE_ENVS or (self.max_opened is not None and self.opened >= self.max_opened):
            raise InvalidInput(f"too many task environments (at most {MAX_LIVE_ENVS} at once, {self.max_opened} "
                               "in all for this batch)")
        self.opened += 1
        session = str(body.get("session", ""))[:200]
        stack = AsyncExitStack()
        try:
            box = await stack.enter_async_context(self.open_env(session, plan))
            if box.backend.name == "local":
                if box.info.metadata.get("isolation") != "namespaces":
                    raise InvalidInput("harbor task environments on the local backend need its namespaces "
                                       "isolation (its fixed /logs, /tests paths are links in a private root)")
                dirs = " ".join(shlex.quote(f"{box.home}/{name}") for name in plan.root_links)
                await self._run(box, f"mkdir -p {dirs} {box.home}/logs/agent {box.home}/logs/verifier "
                                     f"{box.home}/logs/artifacts", plan=plan, cwd=box.home)
            else:
                box = await prepare_remote(box, plan)
            if self.terminal:
                await self._tmux_server(box, plan, stack)
        except BaseException:
            await stack.aclose()
            raise
        env_id = secrets.token_hex(8)
        self.live[env_id] = _Live(box=box, plan=plan, stack=stack)
        return {"id": env_id, "workdir": plan.workdir}

    async def _tmux_server(self, box: Sandbox, plan: EnvPlan, stack: AsyncExitStack) -> None:
        found = await self._run(box, "command -v tmux", plan=plan, cwd=box.home)
        if found["return_code"] != 0:
            raise InvalidInput("the task environment's template has no tmux, which harbor's terminal agent "
                               "(terminus-2) drives")
        env = box.scorer_env({"HOME": box.home, "TERM": "xterm-256color", "SHELL": "/bin/bash", **plan.env})
        proc = await box.backend.spawn(box.info.sandbox_id, ["tmux", "-D"], env=env, limits=TASK_ENV_LIMITS)

        async def stop() -> None:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()

        stack.push_async_callback(stop)
        ready = await self._run(box, TMUX_READY, plan=plan, cwd=box.home)
        if ready["return_code"] != 0:
            raise InvalidInput(f"the task environment's terminal did not start: {ready['stderr'][-500:]}")

    async def _run(self, box: Sandbox, command: str, *, plan: EnvPlan, cwd: str | None = None,
                   env: dict[str, str] | None = None, timeout: float | None = None,
                   stdin: bytes | None = None) -> dict[str, Any]:
        full_env = box.scorer_env({"HOME": box.home, **plan.env, **(env or {})})
        argv = ["/bin/bash", "-c", f"cd {shlex.quote(cwd or plan.workdir)} && {command}"]
        bound = min(float(timeout or EXEC_TIMEOUT_S), EXEC_TIMEOUT_S)
        result = await box.backend.exec(box.info.sandbox_id, argv, env=full_env, timeout_s=bound,
                                        limits=TASK_ENV_LIMITS, stdin=stdin)
        stdout = result.stdout.decode(errors="replace") if isinstance(result.stdout, bytes) else result.stdout
        stderr = result.stderr.decode(errors="replace") if isinstance(result.stderr, bytes) else result.stderr
        code = result.returncode if not result.timed_out else 124
        return {"stdout": stdout, "stderr": stderr, "return_code": code}

    def _live(self, env_id: object) -> _Live:
        live = self.live.get(str(env_id))
        if live is None:
            raise InvalidInput(f"no task environment {env_id!r}")
        return live

    async def _exec(self, body: dict[str, Any]) -> dict[str, Any]:
        live = self._live(body.get("id"))
        env = body.get("env") or {}
        if not isinstance(env, dict) or not all(_ENV_NAME.match(str(k)) for k in env):
            raise InvalidInput("env must map variable names to values")
        cwd = sandbox_path(str(body["cwd"]), live.plan) if body.get("cwd") else None
        timeout = body.get("timeout_sec")
        return await self._run(live.box, str(body["command"]), plan=live.plan, cwd=cwd,
                               env={str(k): str(v) for k, v in env.items()},
                               timeout=float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else None)

    async def _upload(self, env_id: str, target: str, data: bytes) -> dict[str, Any]:
        live = self._live(env_id)
        where = sandbox_path(target, live.plan)
        # Unpacked by tar inside the task sandbox, never here; ownership and modes stay the sandbox user's.
        result = await self._run(live.box, f"mkdir -p {shlex.quote(where)} && tar -x --no-same-owner "
                                           f"--no-same-permissions -f - -C {shlex.quote(where)}",
                                 plan=live.plan, cwd=live.box.home, stdin=data)
        if result["return_code"] != 0:
            raise InvalidInput(f"unpacking into {target} failed: {result['stderr'][-500:]}")
        return {"ok": True}

    async def _download(self, body: dict[str, Any]) -> bytes:
        live = self._live(body.get("id"))
        where = PurePosixPath(sandbox_path(str(body["source"]), live.plan))
        name = f".bw_xfer_{secrets.token_hex(4)}.tar"
        out = f"{live.box.home}/{name}"
        command = (f"if [ -d {shlex.quote(str(where))} ]; then tar -c -f {out} -C {shlex.quote(str(where))} .; "
                   f"else tar -c -f {out} -C {shlex.quote(str(where.parent))} {shlex.quote(where.name)}; fi")
        result = await self._run(live.box, command, plan=live.plan, cwd=live.box.home)
        if result["return_code"] != 0:
            raise FileNotFoundError(f"{body['source']}: {result['stderr'][-500:]}")
        try:
            data: bytes = await live.box.backend.read_file(live.box.info.sandbox_id, name)
        finally:
            await self._run(live.box, f"rm -f {name}", plan=live.plan, cwd=live.box.home)
        if len(data) > MAX_BYTES:
            raise InvalidInput(f"{body['source']} is larger than {MAX_BYTES} bytes")
        return data

    async def _stop(self, body: dict[str, Any]) -> dict[str, Any]:
        live = self.live.pop(str(body.get("id")), None)
        if live is not None:
            await live.stack.aclose()
        return {"ok": True}

    async def _handle(self, request: Request) -> Response:
        if request.headers.get("authorization", "") != f"Bearer {self.key}":
            return _error(401, "this endpoint takes only the key the bridge gave harbor")
        route = request.url.path
        try:
            if route == "/upload":
                data = await request.body()
                if len(data) > MAX_BYTES:
                    return _error(413, f"at most {MAX_BYTES} bytes per transfer")
                return JSONResponse(await self._upload(request.query_params.get("id", ""),
                                                       request.query_params.get("target", ""), data))
            body = await request.json()
            if not isinstance(body, dict):
                return _error(400, "a JSON object is expected")
            if route == "/download":
                return Response(await self._download(body), media_type="application/x-tar")
            handler = {"/start": self._start, "/exec": self._exec, "/stop": self._stop}[route]
            return JSONResponse(await handler(body))
        except FileNotFoundError as exc:
            return _error(404, str(exc))
        except (InvalidInput, KeyError, TypeError, ValueError) as exc:
            return _error(400, str(exc))

    async def __aenter__(self) -> tuple[str, str, int]:
        from benchwright.harness.relay import _QuietServer

        port = free_port()
        app = Starlette(routes=[Route(path, self._handle, methods=["POST"])
                                for path in ("/start", "/exec", "/upload", "/download", "/stop")])
        self._server = _QuietServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                   access_log=False, lifespan="off"))
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
                raise RuntimeError("the harbor environment broker stopped while starting")
            await asyncio.sleep(0.005)
        return f"http://127.0.0.1:{port}", self.key, port

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.gather(self._task, return_exceptions=True)
        for env_id in list(self.live):
            live = self.live.pop(env_id)
            with contextlib.suppress(Exception):
                await asyncio.shield(live.stack.aclose())


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)



def harbor_model_name(model: str) -> str:
    """The LiteLLM model a model-driven harbor agent is told: ``openai/<name>`` (an OpenAI-compatible endpoint, the
    relay, which serves the run's model whatever it is called)."""
    return "openai/" + (model.rsplit("/", 1)[-1] or "model")


def harbor_model_env(endpoint: BridgeEndpoint) -> dict[str, str]:
    """The orchestrator's model endpoint for a model-driven agent: the relay's URL and its per-batch key, in the
    variables harbor's LiteLLM agents read (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``); never a provider key."""
    return {"OPENAI_BASE_URL": endpoint.base_url, "OPENAI_API_KEY": endpoint.key, "OPENAI_API_BASE": endpoint.base_url}


HARBOR_AGENT_KWARGS: dict[str, dict[str, Any]] = {
    "terminus-2": {"record_terminal_session": False,
                   "model_info": {"max_input_tokens": 128000, "max_output_tokens": 8192, "input_cost_per_token": 0.0,
                                  "output_cost_per_token": 0.0}},
}
"""Agent options the bridge sets: no asciinema recording (it would install asciinema from the network), and the
model's context size given, so LiteLLM never looks it up (the relay's model is unknown to LiteLLM's map)."""
