"""Attach: bind the run to its model → ModelProxyArtifact{model_id, litellm_config_yaml} (secrets by name only).

When the model names a provider secret (or the deployment says ``model_proxy = "always"``), Attach starts the run's
model proxy (the real LiteLLM proxy, role proxy) holding that secret; the scorer side only ever gets the proxy's URL
and a per-run fake key. Otherwise a keyless model is called directly (nothing to isolate, no start-up to pay).

Then Attach proves the model is live (§2: it sits right before Atomize for this): one ``max_tokens=1`` completion
through exactly the route the scorer's calls will take (``benchwright.sut.run_sut``). A dead endpoint, a refused
key or an unknown model fails the phase with the provider's answer in plain words, so the run ends ``error`` at
Attach instead of erroring every task. The probe's cost (a few tokens) is not recorded: it belongs to no task, and
cost.model is the sum of the tasks' model spend.
"""

from __future__ import annotations

import time

from temporalio import activity

from activities.common import Deps, in_thread, phase
from benchwright.events import ModelProxyArtifact, ProxyLingerMetered, SandboxCreated, SandboxKilled
from benchwright.errors import Unavailable
from benchwright.pipeline import FinishInput, PhaseInput, PhaseResult
from benchwright.procreg import ProcessRegistry
from benchwright.schemas import ModelSpec
from benchwright.prices import prices_for
from benchwright.proxy.model_proxy import (
    ProxyHandle,
    load_handle,
    secret_env_name,
    start_model_proxy,
    stop_model_proxy,
)
from benchwright.proxy_config import litellm_config_yaml
from benchwright.sut import probe, run_sut
from benchwright.store.events import NewEvent, append_events, event_key
from benchwright.store.policy import secret_value
from benchwright.store.runs import get_run


async def _start_proxy(deps: Deps, *, run_id: str, spec: ModelSpec) -> ProxyHandle:
    value = None
    if spec.secret is not None:
        run = await in_thread(get_run, deps.engine, run_id=run_id)
        value = await in_thread(secret_value, deps.engine, account_id=run.account_id, name=spec.secret)
    return await in_thread(start_model_proxy, run_dir=deps.run_dir(run_id), spec=spec, secret_value=value,
                           registry=ProcessRegistry(deps.settings.data_dir))


async def live_proxy(deps: Deps, *, run_id: str, spec: ModelSpec) -> ProxyHandle | None:
    """The run's model proxy for Materialize: the one Attach started, or a new one if it died with the worker that
    started it (proxies never outlive their worker) while the run still needs it (a keyed model, or a handle left
    behind). None for a run called directly."""
    handle = load_handle(deps.run_dir(run_id))
    if handle is not None and handle.alive():
        return handle
    if handle is None and spec.secret is None:
        return None
    return await _start_proxy(deps, run_id=run_id, spec=spec)


class AttachActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="attach")
    async def attach(self, inp: PhaseInput) -> PhaseResult:
        spec = inp.launch.model
        proxied = spec.secret is not None or self.deps.settings.model_proxy == "always"
        async with phase(self.deps, inp) as scope:
            secret_env = secret_env_name(spec.secret) if spec.secret else None
            handle: ProxyHandle | None = None
            if proxied:
                handle = await _start_proxy(self.deps, run_id=inp.run_id, spec=spec)
                scope.emit("proxy", SandboxCreated(
                    sandbox_id=f"proxy-{handle.pid}", role="proxy", backend="local", instance_size="local-process",
                    isolation="process", metadata={"benchwright_role": "proxy", "port": handle.port}))
            await self._probe(inp, handle)
            scope.emit("artifact", ModelProxyArtifact(model_id=spec.identifier,
                                                      litellm_config_yaml=litellm_config_yaml(spec, secret_env=secret_env)))
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, control=scope.control,
                           detail={"model_proxy": proxied})

    async def _probe(self, inp: PhaseInput, proxy: ProxyHandle | None) -> None:
        """The liveness probe; on failure the proxy just started is stopped (the workflow only stops proxies of
        runs whose Attach completed) before the phase fails with the probe's plain-words error."""
        settings = self.deps.settings
        sut = run_sut(inp.launch.model, prices=prices_for(inp.launch.model), proxy=proxy, concurrency=1,
                      timeout_s=settings.sut_probe_timeout_s, retries=settings.sut_probe_retries)
        try:
            await probe(sut, spec=inp.launch.model)
        except Unavailable:
            if proxy is not None:
                await in_thread(stop_model_proxy, self.deps.run_dir(inp.run_id))
            raise
        finally:
            await sut.aclose()

    @activity.defn(name="stop_model_proxy")
    async def stop_proxy(self, inp: FinishInput) -> None:
        """After the run (and its linger window): stop the proxy, bill its run time as sandbox cost and the linger
        separately (cost.proxy_linger)."""
        run_dir = self.deps.run_dir(inp.run_id)
        handle = load_handle(run_dir)
        if handle is None:
            return
        run = await in_thread(get_run, self.deps.engine, run_id=inp.run_id)
        lifetime = await in_thread(stop_model_proxy, run_dir) or 0.0
        ended = run.finished_at.timestamp() if run.finished_at else time.time()
        linger = max(0.0, min(lifetime, time.time() - ended))
        rate = self.deps.settings.proxy_usd_per_hour / 3600
        await in_thread(append_events, self.deps.engine, inp.run_id, [
            NewEvent.of(event_key(inp.run_id, "proxy", "killed"), SandboxKilled(
                sandbox_id=f"proxy-{handle.pid}", role="proxy", duration_ms=int(lifetime * 1000),
                cost_usd=(lifetime - linger) * rate)),
            NewEvent.of(event_key(inp.run_id, "proxy", "linger"), ProxyLingerMetered(
                seconds=round(linger, 3), cost_usd=linger * rate)),
        ])
