"""``benchwright report RUN -o report.html``: download a run's report (issue 26, docs/report.md).

Registered on the main app by ``benchwright/cli/app.py``; it shares the client helpers of ``cli_answers``.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from benchwright.cli.answers import ApiKey, ApiUrl, DataDir, _call
from benchwright.cli.support import console

REPORT_FILES = ("report.html", "results.json")
REPORT_WAIT_S = 30.0
"""How long ``report`` waits for a finished run's report: it is written after the run's end (its score), normally
within a second; an attempt may take minutes (docs/report.md), and then the command says to try again later."""
REPORT_POLL_S = 0.2


def _no_file(run_id: str, name: str, why: str) -> NoReturn:
    console.print(f"[red]error:[/red] run {run_id} has no {name} yet: {why}")
    raise typer.Exit(1)


def _await_report(client: Any, run_id: str, name: str) -> dict[str, dict[str, Any]]:
    """The run's files once ``name`` is among them, or as they stand after ``REPORT_WAIT_S``."""
    console.print(f"run {run_id} has ended; waiting for its report to be written")
    deadline = time.monotonic() + REPORT_WAIT_S
    while True:
        listed = {f["name"]: f for f in client.files(run_id)["files"]}
        if name in listed or time.monotonic() >= deadline:
            return listed
        time.sleep(REPORT_POLL_S)


def report_cmd(run_id: str,
               output: Annotated[Path | None, typer.Option("-o", "--output", help=(
                   "Where to write it (default: the file's own name in the current directory)."))] = None,
               name: Annotated[str | None, typer.Option("--file", help=(
                   "Which report file: report.html (one self-contained page) or results.json (lm-eval's layout); "
                   "default: results.json when -o ends in .json, else report.html."))] = None,
               data_dir: DataDir = None, api_url: ApiUrl = None, api_key: ApiKey = None) -> None:
    """Download a finished run's report: one self-contained HTML page (narration, score and interval, heatmap,
    per-group bars, latency and cost, failure reasons, the Driver's decisions, the receipt), or its results.json."""

    chosen = name or ("results.json" if output is not None and output.suffix.lower() == ".json" else "report.html")
    if chosen not in REPORT_FILES:
        raise typer.BadParameter(f"--file must be one of {', '.join(REPORT_FILES)}", param_hint="--file")
    target = output or Path(chosen)
    if target.is_dir():
        target = target / chosen

    def fetch(client: Any) -> tuple[dict[str, Any], bytes]:
        listed = {f["name"]: f for f in client.files(run_id)["files"]}
        if chosen not in listed:
            if not client.run(run_id).get("terminal"):
                _no_file(run_id, chosen, "the run is still running")
            # Its score is in and its report follows (``benchwright run --wait`` and then ``report``).
            listed = _await_report(client, run_id, chosen)
            if chosen not in listed:
                _no_file(run_id, chosen, f"its report was not written within {REPORT_WAIT_S:g} s (or could not be "
                                         "written); try again later")
        return listed[chosen], client.file(run_id, chosen)

    meta, data = _call(fetch, data_dir, api_url, api_key)
    digest = hashlib.sha256(data).hexdigest()
    if digest != meta["digest"] or len(data) != meta["size"]:
        console.print(f"[red]error:[/red] {chosen} arrived damaged (sha256 {digest}, {len(data)} bytes; the run "
                          f"recorded {meta['digest']}, {meta['size']} bytes)")
        raise typer.Exit(1)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.part")
    tmp.write_bytes(data)
    tmp.replace(target)
    console.print(f"wrote {target} ({len(data):,} bytes, sha256 {digest[:12]})")
