"""``benchwright report RUN -o report.html``: download a run's report (issue 26, docs/report.md).

Registered on the main app by ``benchwright/cli/app.py``; it shares the client helpers of ``cli_answers``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any

import typer

from benchwright.cli.answers import ApiKey, ApiUrl, DataDir, _call
from benchwright.cli.support import console

REPORT_FILES = ("report.html", "results.json")


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
            run = client.run(run_id)
            why = ("the run is still running" if not run.get("terminal")
                   else "its report is still being written (or could not be written); try again in a moment")
            console.print(f"[red]error:[/red] run {run_id} has no {chosen} yet: {why}")
            raise typer.Exit(1)
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
