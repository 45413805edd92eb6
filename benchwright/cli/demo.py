"""``benchwright demo``, ``dev-model`` and ``scripted-llm``: the offline demo and the loopback test doubles it (and the
tests) serve. Registered on the main app by ``benchwright/cli/app.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from benchwright.cli.support import SAMPLE, DataDir, console, out
from benchwright.cli.support import data_dir_of as _data_dir
from benchwright.cli.support import run_summary as _summary
from benchwright.cli.support import watch as watch_run


def dev_model(answers: Annotated[Path, typer.Option(help="JSONL answer key of {question, answer}.")] = SAMPLE,
              accuracy: Annotated[float, typer.Option(min=0.0, max=1.0, help="Fraction answered correctly.")] = 1.0,
              latency_ms: Annotated[float, typer.Option(min=0.0, help="Latency per request, in ms.")] = 0.0,
              port: Annotated[int, typer.Option(help="Port (0 picks a free one).")] = 9000,
              host: str = "127.0.0.1",
              model_name: str = "dev",
              api_key: Annotated[str | None, typer.Option(help="Demand this bearer key, like a real provider.")] = None,
              ready_file: Annotated[Path | None, typer.Option(help="Write {url, port} here once listening.")] = None,
              agent: Annotated[bool, typer.Option(
                  "--agent", help="Serve the scripted agent for the bundled terminal-basics recipe instead "
                  "(docs/agents.md: it solves 16 of its 22 tasks).")] = False,
              ) -> None:
    """Serve an OpenAI-compatible chat-completions TEST DOUBLE that answers from an answer key."""
    from benchwright.testkit.devmodel import DevModelConfig, load_answers, serve

    if agent:
        from benchwright.testkit import product_double

        config = product_double.config(latency_ms=latency_ms, model_name=model_name, api_key=api_key)
    else:
        config = DevModelConfig(answers=load_answers(answers), accuracy=accuracy, latency_ms=latency_ms,
                                model_name=model_name, api_key=api_key)
    console.print(f"dev model (test double) on http://{host}:{port}/v1: {len(config.answers)} answers, "
                  f"accuracy {accuracy}, latency {latency_ms} ms")
    serve(config, host=host, port=port, ready_file=str(ready_file) if ready_file else None)


def scripted_llm(script: Annotated[Path, typer.Option(help="JSON/YAML script: {model: [conversation, ...]}.")],
                 port: Annotated[int, typer.Option(help="Port to listen on.")] = 9100,
                 host: str = "127.0.0.1") -> None:
    """Serve a scripted-LLM TEST DOUBLE (OpenAI-compatible) that replays a Driver's turns and records requests."""
    from benchwright.testkit.scripted_llm import ScriptedLlm, load_script, serve

    llm = ScriptedLlm(scripts=load_script(script))
    console.print(f"scripted LLM (test double) on http://{host}:{port}/v1: models {', '.join(sorted(llm.scripts))}; "
                  f"recorded requests at /_scripted/requests")
    serve(llm, host=host, port=port)


class _Signalled(Exception):
    """SIGTERM (or SIGINT) reached the demo: it stops what it started before it exits."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _demo_dir(data_dir: Path | None, keep_running: bool) -> tuple[Path, bool]:
    """Where the demo's stack keeps its data, and whether that is a temporary directory the demo removes.

    ``--data-dir`` wins. A kept-running demo uses the default data directory (``$BENCHWRIGHT_DATA_DIR`` or
    ``~/.benchwright``), so every other command finds its stack, unless a ``benchwright up`` already runs there;
    a demo that stops at the end uses a temporary directory and removes it."""
    from benchwright.stack.supervisor import stack_holder

    if data_dir is not None:
        return _data_dir(data_dir), False
    default = _data_dir(None)
    if keep_running and stack_holder(default) is None:
        return default, False
    if keep_running:
        console.print(f"[yellow]note:[/yellow] a stack already runs on {default}; this demo uses its own data "
                      "directory")
    return Path(tempfile.mkdtemp(prefix="benchwright-demo-")), True


def demo(data_dir: DataDir = None,
         accuracy: Annotated[float, typer.Option(min=0.0, max=1.0, help="Dev model accuracy.")] = 0.85,
         keep_running: Annotated[bool, typer.Option(
             help="Leave the stack up after the run (Ctrl-C stops it), on the default data directory so the other "
                  "commands (runs, show, events...) find it.")] = False,
         ) -> None:
    """Bring up the stack and a dev model, run the bundled 60-row sample end to end, print the score. SIGTERM or
    Ctrl-C stops everything it started; a demo without --keep-running removes its data when it ends."""
    import shutil
    import signal

    from benchwright.client import Client
    from benchwright.stack.devstack import free_ports
    from benchwright.stack.supervisor import dashboard_url, stack_holder
    from benchwright.stack.teardown import reap_stack
    from benchwright.testkit.devmodel import rows_answered_correctly

    def _on_signal(signum: int, _frame: Any) -> None:
        raise _Signalled(signum)

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    procs: list[subprocess.Popen[bytes]] = []
    directory, temporary = _demo_dir(data_dir, keep_running)
    code = 1
    try:
        directory.mkdir(parents=True, exist_ok=True)
        ports = dict(zip(("api", "temporal", "ui"), free_ports(3), strict=True))
        logs = directory / "logs"
        logs.mkdir(exist_ok=True)
        console.print(f"[bold]Benchwright demo[/bold] (data in {directory}"
                      + (", removed when the demo ends)" if temporary else ")"))
        unisolated = []
        if os.geteuid() != 0:
            # Namespaced sandboxes need root; the demo's bundled scorer is known code, so on a laptop it runs
            # without them rather than not at all, and says so. `benchwright up` never does this unless asked.
            console.print("[yellow]note:[/yellow] not running as root, so the demo's sandboxes run without namespace "
                          "isolation (recorded on the run as isolation 'none')")
            unisolated = ["--allow-unisolated"]
        ready = directory / "dev-model.json"
        ready.unlink(missing_ok=True)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "benchwright.cli", "dev-model", "--answers", str(SAMPLE), "--accuracy",
             str(accuracy), "--latency-ms", "20", "--port", "0", "--ready-file", str(ready)],
            stdin=subprocess.DEVNULL, stdout=(logs / "dev-model.log").open("ab"), stderr=subprocess.STDOUT,
            start_new_session=True))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "benchwright.cli", "up", "--data-dir", str(directory), "--api-port",
             str(ports["api"]), "--temporal-port", str(ports["temporal"]), "--ui-port", str(ports["ui"]),
             *unisolated], stdin=subprocess.DEVNULL, start_new_session=True))
        model_proc, stack = procs
        dev = _await_file(directory / "dev.json", stack, "the stack")
        model_url = _await_file(ready, model_proc, "the dev model")["url"]
        with Client(dev["api_url"], dev["api_key"]) as client:
            launched = client.launch(dataset=str(SAMPLE), model={"identifier": "openai/dev", "api_base": model_url})
            console.print(f"launched run {launched['id']} against the dev model (test double, accuracy {accuracy})")
            final = watch_run(client, launched["id"])
        out.print(_summary(final), highlight=False)
        right, rows = rows_answered_correctly(SAMPLE, accuracy)
        out.print(f"the dev model answers exactly {right} of these {rows} questions right at --accuracy {accuracy} "
                  f"({right / rows:.1%}): it picks which ones by a hash of each question, so on a small sample the "
                  "count is not accuracy x rows", highlight=False)
        code = 0 if final["status"] == "ok" else 1
        if keep_running:
            env = "" if directory == _data_dir(None) else f"export BENCHWRIGHT_DATA_DIR={directory}; "
            out.print(f"dashboard:   {dashboard_url(dev['api_url'])}  (sign in with the api_key in "
                      f"{directory / 'dev.json'})\n"
                      f"run:         {dev['api_url']}/v1/runs/{final['id']}\n"
                      f"Temporal UI: {dev['temporal_ui_url']}/namespaces/default/workflows/{final['id']}\n"
                      f"CLI:         {env}benchwright runs; {env}benchwright show {final['id']}", highlight=False)
            console.print("stack left running; Ctrl-C (or SIGTERM) stops it")
            stack.wait()
        else:
            out.print(f"the stack stops now (its addresses go with it); `benchwright demo --keep-running` leaves it "
                      f"up to explore run {final['id']} in the dashboard and the CLI", highlight=False)
    except (KeyboardInterrupt, _Signalled) as exc:
        code = 128 + (exc.signum if isinstance(exc, _Signalled) else signal.SIGINT)
    except Exception as exc:  # noqa: BLE001 - the demo reports any failure plainly and still cleans up
        console.print(f"[red]demo failed:[/red] {exc}")
    finally:
        for sig in previous:  # a second Ctrl-C must not cut the clean-up short
            signal.signal(sig, signal.SIG_IGN)
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(procs):  # `up` stops its children within its shutdown timeout (30 s), then sweeps
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # what a killed `up` could not stop (its children live in their own sessions) is found by the registry
        if procs and stack_holder(directory) is None:  # never another `up`'s stack on a given --data-dir
            reap_stack(data_dir=directory, workers_timeout_s=10, others_timeout_s=5)
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)
        console.print("stopped the stack and the dev model" + (f"; removed {directory}" if temporary else ""))
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    raise typer.Exit(code)


def _await_file(path: Path, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 90.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    with console.status(f"waiting for {what}..."):
        while time.monotonic() < deadline:
            if path.exists():
                return json.loads(path.read_text())  # type: ignore[no-any-return]
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with code {proc.returncode} before it was ready")
            time.sleep(0.05)
    raise RuntimeError(f"{what} was not ready within {timeout_s:.0f} s")
