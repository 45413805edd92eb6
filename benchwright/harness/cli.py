"""``benchwright harness install`` and the ``run`` flags of a harness-bridge launch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from benchwright.cli.support import BadFlag

harness_app = typer.Typer(no_args_is_help=True,
                          help="Harness runtimes for bridge runs (inspect, lm-eval, lighteval, harbor).")


@harness_app.command("install")
def install_cmd(names: Annotated[list[str], typer.Argument(
                    help="Harnesses to install: inspect, lmeval, lighteval, harbor (needs Python >= 3.12).")],
                data_dir: Annotated[Path | None, typer.Option(envvar="BENCHWRIGHT_DATA_DIR")] = None,
                harness_dir: Annotated[Path | None, typer.Option(
                    envvar="BENCHWRIGHT_HARNESS_DIR", help="Default: <data dir>/harness.")] = None) -> None:
    """Build each harness's venv once for this deployment (bridge runs mount it read-only; a run never installs)."""
    from benchwright.errors import BenchwrightError
    from benchwright.harness.install import harness_root, install
    from benchwright.settings import Settings

    settings = Settings(data_dir=data_dir) if data_dir else Settings()
    root = harness_root(data_dir=settings.data_dir, harness_dir=harness_dir or settings.harness_dir)
    for name in names:
        typer.echo(f"installing the {name} harness under {root} ...")
        try:
            path, seconds = install(root, name, log=None)
        except BenchwrightError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"{name}: {path} ({'already installed' if seconds == 0 else f'{seconds:.0f} s'})")


def harness_body(harness: str | None, config: str | None, task: Path | None, files: list[Path]) -> dict[str, Any]:
    """The launch keys ``run``'s harness flags say (``{}`` when none is given).

    Raises:
        BadFlag: ``--harness-config`` is not a JSON object (or its @file cannot be read).
    """
    body: dict[str, Any] = {}
    if harness is not None:
        body["harness"] = harness
    if config is None and task is None and not files:
        return body
    text = config or "{}"
    try:
        parsed = json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)
    except (OSError, ValueError) as exc:
        raise BadFlag(f"--harness-config must be a JSON object or @file.json: {exc}") from None
    if not isinstance(parsed, dict):
        raise BadFlag("--harness-config must be a JSON object")
    if task is not None:
        parsed["task_file"] = task.read_text()
    if files:
        parsed["files"] = {**parsed.get("files", {}), **{f.name: f.read_text() for f in files}}
    body["harness_config"] = parsed
    return body
