"""harbor task environments on the run's backend, which need not be the worker's: the template each task runs on.

harbor's orchestrator runs on the worker's own local backend (harbor's venv is mounted from the worker's harness
directory; a remote backend cannot mount it), and never holds a backend credential: each trial's environment is a
``harbor_task_env`` sandbox the worker's ``TaskEnvBroker`` opens on the run's backend on harbor's behalf, through
Benchwright's sandbox layer (``open_sandbox``: SandboxCreated/SandboxKilled, egress proxy, cost).

There is no Docker engine anywhere, so a task's image is never pulled or built. On the local backend the host image
stands in for every ``FROM``; its fixed paths are links in a private root. On ``e2b`` and ``sandbox0`` the operator
maps images to templates (``Settings.harbor_templates``: ``{"e2b": {"ubuntu:24.04": "<E2B template id>"}}``, an
image for sandbox0); a task whose ``FROM`` has no template there is refused before harbor starts, naming the task,
the line and the setting. The template must hold harbor's ``/logs``, ``/tests``, ``/solution`` and the task's
``WORKDIR`` as top-level directories its user can write (``prepare_remote`` checks each task sandbox and refuses
the trial naming what is missing).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from benchwright.harness.harbor import EnvPlan, Unmappable
from benchwright.sandbox.base import TEMPLATE_KEY
from benchwright.sandbox.local import ROOT_LINKS_KEY

TEMPLATE_KIND = {"e2b": "E2B template", "sandbox0": "sandbox0 image"}


def place_plans(plans: Mapping[str, EnvPlan], *, backend: str,
                templates: Mapping[str, Mapping[str, str]]) -> dict[str, EnvPlan]:
    """``plans`` with the template each task environment starts from on ``backend`` (``EnvPlan.template``; None on
    the local backend, whose host image stands in for every image).

    Raises:
        Unmappable: a task's image has no template on ``backend`` (or it names no image), before harbor starts.
    """
    if backend == "local":
        return dict(plans)
    mapped = templates.get(backend) or {}
    kind = TEMPLATE_KIND.get(backend, f"{backend} template")
    found: dict[str, EnvPlan] = {}
    for key, plan in plans.items():
        task = key.removesuffix("/environment")
        if plan.image is None:
            raise Unmappable(f"harbor task {task}: environment/Dockerfile has no FROM line, so no {kind} can stand "
                             f"in for its image on the {backend} backend")
        template = mapped.get(plan.image)
        if template is None:
            raise Unmappable(
                f"harbor task {task}: environment/Dockerfile line {plan.image_line} (FROM {plan.image}) cannot be "
                f"mapped on the {backend} backend: no {kind} is mapped to the image {plan.image!r} (there is no "
                f"Docker engine to pull or build it; map one with BENCHWRIGHT_HARBOR_TEMPLATES, e.g. "
                f'{{"{backend}": {{"{plan.image}": "<{kind}>"}}}}; mapped on {backend}: '
                f"{', '.join(sorted(mapped)) or 'none'})")
        found[key] = dataclasses.replace(plan, template=template)
    return found


def env_options(plan: EnvPlan) -> dict[str, object]:
    """The task sandbox's ``create`` options: the root links on the local backend, the template elsewhere."""
    if plan.template is None:
        return {ROOT_LINKS_KEY: plan.root_links}
    return {TEMPLATE_KEY: plan.template}
