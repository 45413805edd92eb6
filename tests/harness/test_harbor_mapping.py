"""The harbor bridge's domain rules, no stack: which task paths resolve, how a task's environment maps onto the
backend's template (and what is refused, naming the line), the interpreter search for harbor's venv, and the local
backend's root links."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchwright.errors import InvalidInput
from benchwright.harness import install
from benchwright.harness.harbor import (
    EnvPlan,
    TaskSet,
    Unmappable,
    environment_plans,
    map_environment,
    resolve_task_set,
    sandbox_path,
    task_files,
)
from benchwright.harness.harbor_remote import env_options, place_plans
from benchwright.sandbox.local.backend import _root_links


def _task(root: Path, name: str, dockerfile: str | None, toml: str = "") -> Path:
    task = root / name
    (task / "environment").mkdir(parents=True)
    (task / "task.toml").write_text(toml)
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    return task


def test_the_bundled_set_resolves_in_name_order_and_maps_onto_the_template(tmp_path: Path) -> None:
    tasks = resolve_task_set("bundled/demo", harness_dir=tmp_path)
    assert [t.name for t in tasks.tasks] == ["hello-file", "json-config", "reverse-script", "sum-to-100"]
    plans = environment_plans(tasks)
    assert set(plans) == {f"{t.name}/environment" for t in tasks.tasks}
    assert all(p == EnvPlan(workdir="/app", image="ubuntu:24.04", image_line=1) for p in plans.values())
    files = task_files(tasks)
    assert "hello-file/solution/solve.sh" in files and "sum-to-100/tests/test.sh" in files
    one = resolve_task_set("bundled/demo/hello-file", harness_dir=tmp_path)
    assert one.tasks == [one.root] and "hello-file/instruction.md" in task_files(one)


def test_paths_stay_under_their_root(tmp_path: Path) -> None:
    (tmp_path / "harbor-tasks").mkdir()
    (tmp_path / "harbor-tasks" / "out").symlink_to("/etc")
    for path in ("bundled/../../..", "out", "missing"):
        with pytest.raises(InvalidInput):
            resolve_task_set(path, harness_dir=tmp_path)
    _task(tmp_path / "harbor-tasks" / "mine", "t1", "FROM python:3.12\nWORKDIR /work\nENV A=1 B=two\n")
    tasks = resolve_task_set("mine", harness_dir=tmp_path)
    assert environment_plans(tasks) == {"t1/environment": EnvPlan(workdir="/work", env={"A": "1", "B": "two"},
                                                                  image="python:3.12", image_line=1)}


@pytest.mark.parametrize(("dockerfile", "toml", "says"), [
    ("FROM ubuntu:24.04\nRUN apt-get install -y curl\n", "", "line 2 ('RUN apt-get install -y curl') needs an image "
                                                             "build (RUN)"),
    ("FROM ubuntu\nCOPY data /app/data\n", "", "needs an image build (COPY)"),
    ("FROM ubuntu\nWORKDIR /usr/src/app\n", "", "WORKDIR must be a new top-level directory"),
    ("FROM ubuntu\nWORKDIR /tmp\n", "", "WORKDIR must be a new top-level directory"),
    ("FROM ubuntu\nENV PATH=$PATH:/x\n", "", "literal NAME=value"),
    (None, '[environment]\ndocker_image = "ghcr.io/x/y:1"\n', "docker_image"),
])
def test_what_needs_a_container_engine_is_refused_naming_it(tmp_path: Path, dockerfile: str | None, toml: str,
                                                            says: str) -> None:
    with pytest.raises(Unmappable) as caught:
        map_environment(_task(tmp_path, "t", dockerfile, toml))
    assert caught.value.code == "harbor_environment_unmappable"
    assert "harbor task t:" in str(caught.value) and says in str(caught.value)


def test_a_compose_environment_is_refused(tmp_path: Path) -> None:
    task = _task(tmp_path, "t", "FROM ubuntu\n")
    (task / "environment" / "docker-compose.yaml").write_text("services: {}\n")
    with pytest.raises(Unmappable, match=r"docker-compose\.yaml cannot be mapped"):
        map_environment(task)


def test_a_remote_backend_maps_each_image_to_its_template_and_refuses_an_unmapped_one(tmp_path: Path) -> None:
    _task(tmp_path / "set", "a", "FROM --platform=linux/amd64 ubuntu:24.04 AS base\nWORKDIR /app\n")
    _task(tmp_path / "set", "b", "# comment\nFROM debian:12\n")
    plans = environment_plans(_set(tmp_path / "set"))
    assert place_plans(plans, backend="local", templates={}) == plans  # the host image stands in for any
    assert env_options(plans["a/environment"]) == {"root_links": ["app", "logs", "solution", "tests"]}
    templates = {"e2b": {"ubuntu:24.04": "bw-ubuntu", "debian:12": "bw-debian"}, "sandbox0": {"ubuntu:24.04": "u"}}
    placed = place_plans(plans, backend="e2b", templates=templates)
    assert {k: p.template for k, p in placed.items()} == {"a/environment": "bw-ubuntu", "b/environment": "bw-debian"}
    assert env_options(placed["b/environment"]) == {"template": "bw-debian"}
    with pytest.raises(Unmappable) as caught:
        place_plans(plans, backend="sandbox0", templates=templates)
    assert caught.value.code == "harbor_environment_unmappable"
    assert str(caught.value) == (
        "harbor task b: environment/Dockerfile line 2 (FROM debian:12) cannot be mapped on the sandbox0 backend: no "
        "sandbox0 image is mapped to the image 'debian:12' (there is no Docker engine to pull or build it; map one "
        'with BENCHWRIGHT_HARBOR_TEMPLATES, e.g. {"sandbox0": {"debian:12": "<sandbox0 image>"}}; mapped on '
        "sandbox0: ubuntu:24.04)")
    _task(tmp_path / "bare", "c", None)
    with pytest.raises(Unmappable, match="has no FROM line, so no E2B template can stand in"):
        place_plans(environment_plans(_set(tmp_path / "bare")), backend="e2b", templates=templates)


def _set(root: Path) -> TaskSet:
    return TaskSet(root=root, tasks=sorted(p for p in root.iterdir()))


def test_harbor_paths_map_to_the_task_sandbox_and_nothing_else() -> None:
    plan = EnvPlan(workdir="/app")
    assert plan.root_links == ["app", "logs", "solution", "tests"]
    assert sandbox_path("/logs/verifier", plan) == "/logs/verifier"
    assert sandbox_path("out.txt", plan) == "/app/out.txt"
    for bad in ("/etc/passwd", "/sandbox/x", "/logs/../etc", "/"):
        with pytest.raises(InvalidInput):
            sandbox_path(bad, plan)


def test_root_links_are_plain_new_top_level_names() -> None:
    assert _root_links(["logs", "app"]) == [("/sandbox/logs", "/logs"), ("/sandbox/app", "/app")]
    assert _root_links(None) == []
    for bad in (["etc"], ["tmp"], ["a/b"], [".."], ["Logs"], "logs", [1]):
        with pytest.raises(ValueError):
            _root_links(bad)


def test_harbor_needs_a_newer_python_and_says_so_when_none_is_found(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    assert install.RUNTIMES["harbor"].min_python == (3, 12)
    monkeypatch.setattr(install, "PYENV_VERSIONS", tmp_path / "none")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InvalidInput) as caught:
        install.find_python((3, 12), name="harbor")
    assert caught.value.code == "harness_needs_python" and "needs Python >= 3.12" in str(caught.value)
    if install.sys.version_info < (3, 12):  # the worker's own interpreter is too old: the install refuses too
        with pytest.raises(InvalidInput, match=r"needs Python >= 3\.12"):
            install.install(tmp_path / "h", "harbor")
    assert not (tmp_path / "h" / "harbor-0.26.0" / install.STAMP).exists()


async def test_the_broker_takes_only_its_key_this_runs_tasks_and_harbor_paths(tmp_path: Path) -> None:
    import contextlib
    import sys
    from collections.abc import AsyncIterator

    import httpx

    from benchwright.harness.harbor import TaskEnvBroker, bundled_root
    from benchwright.sandbox.lifecycle import Sandbox
    from benchwright.sandbox.local import ROOT_LINKS_KEY, WORK_INSIDE, LocalBackend

    backend = LocalBackend(tmp_path / "sandboxes")

    @contextlib.asynccontextmanager
    async def open_env(session: str, plan: EnvPlan) -> AsyncIterator[Sandbox]:
        info = await backend.create(role="harbor_task_env", run_id="broker-test",
                                    metadata={ROOT_LINKS_KEY: plan.root_links})
        try:
            yield Sandbox(backend=backend, info=info, home=WORK_INSIDE, python=sys.executable)
        finally:
            await backend.kill(info.sandbox_id)

    tasks = resolve_task_set("bundled/demo", harness_dir=tmp_path)
    root = str(bundled_root() / "demo")
    broker = TaskEnvBroker(environment_plans(tasks), open_env, tasks_root=root, max_opened=1)
    try:
        async with broker as (url, key, _port), httpx.AsyncClient(base_url=url, timeout=60) as http:
            auth = {"authorization": f"Bearer {key}"}
            assert (await http.post("/start", json={"environment_dir": f"{root}/hello-file/environment"})
                    ).status_code == 401
            other = await http.post("/start", json={"environment_dir": "/etc/environment"}, headers=auth)
            assert other.status_code == 400 and "not the environment of a task of this run" in other.text
            started = await http.post("/start", json={"environment_dir": f"{root}/hello-file/environment"},
                                      headers=auth)
            env_id = started.json()["id"]
            done = await http.post("/exec", json={"id": env_id, "command": "echo hi > /logs/verifier/x && pwd"},
                                   headers=auth)
            assert done.json() == {"stdout": "/app\n", "stderr": "", "return_code": 0}
            for source in ("/etc/passwd", "/sandbox/../etc", "/logs/../etc/passwd"):
                refused = await http.post("/download", json={"id": env_id, "source": source}, headers=auth)
                assert refused.status_code == 400, source
            tar = await http.post("/download", json={"id": env_id, "source": "/logs/verifier"}, headers=auth)
            assert tar.status_code == 200 and b"hi\n" in tar.content
            again = await http.post("/start", json={"environment_dir": f"{root}/json-config/environment"},
                                    headers=auth)
            assert again.status_code == 400 and "too many task environments" in again.text
            assert len(await backend.list_alive()) == 1
        assert await backend.list_alive() == []  # leaving the broker kills what harbor left open
    finally:
        await backend.close()
