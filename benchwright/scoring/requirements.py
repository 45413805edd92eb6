"""Setup of a scorer's Python requirements: installed into the work sandbox's ``DEPS_DIR`` through the egress proxy
(so pip's hosts meet the account's host policy and land in the blocked-host log), then snapshotted (SnapshotCreated)
for the phases after. The ``setup`` activity brackets it (``activities.setup``), with the phase cache around it."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from benchwright.errors import InvalidInput
from benchwright.sandbox import ExecLimits
from benchwright.sandbox.lifecycle import DEPS_DIR, Emit, open_sandbox, record_snapshot, take_snapshot
from benchwright.settings import Settings

PIP_TIMEOUT_S = 600


class RequirementsFailed(InvalidInput):
    code = "requirements_failed"


async def setup_requirements(*, engine: Engine, settings: Settings, run_id: str, invocation: int,
                             requirements: list[str], before: str | None, emit: Emit | None = None) -> None:
    """Install ``requirements`` on top of snapshot ``before`` and snapshot the result; with nothing to install,
    the post-Fetch filesystem keeps its content-addressed id (recorded as Setup's snapshot, nothing started).
    ``emit``: the phase's, so that the recorded id of nothing installed lands with its close (``record_snapshot``).

    Raises:
        RequirementsFailed: pip failed (its exit status and output's tail in the message).
    """
    if not requirements and before is not None:
        await record_snapshot(engine=engine, run_id=run_id, phase="setup", invocation=invocation, snapshot_id=before,
                              emit=emit)
        return
    async with open_sandbox(engine=engine, settings=settings, run_id=run_id, role="work", key=("setup", invocation),
                            restore=before) as box:
        if requirements:
            index = settings.pip_index_url
            env = box.scorer_env({"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1",
                                  **({"PIP_INDEX_URL": index} if index else {})})
            result = await box.backend.exec(
                box.info.sandbox_id,
                [box.python, "-m", "pip", "install", "--no-cache-dir", "--target", DEPS_DIR, *requirements],
                env=env, timeout_s=PIP_TIMEOUT_S,
                limits=ExecLimits(cpu_seconds=PIP_TIMEOUT_S, memory_mb=2048, wall_seconds=PIP_TIMEOUT_S,
                                  cpu_cores=2.0))
            if result.returncode != 0:
                tail = (result.stderr or result.stdout).decode(errors="replace").strip()[-1500:]
                raise RequirementsFailed(
                    f"installing {', '.join(requirements)} failed (exit {result.returncode}"
                    f"{', ' + result.killed_reason if result.killed_reason else ''}): {tail}")
        await take_snapshot(engine=engine, settings=settings, box=box, run_id=run_id, phase="setup",
                            invocation=invocation)
