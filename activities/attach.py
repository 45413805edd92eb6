"""Attach: bind the run to its model → ModelProxyArtifact{model_id, litellm_config_yaml} (secrets by name only).

Every run's model calls go through the credential proxy (§4, §11; ``benchwright.proxy.model_proxy``): Attach
registers the run's route there, with the real key when the model names a provider secret (read from the store and
handed straight to the proxy), and the scorer side only ever gets the proxy's URL and the run's per-run key. The
proxy is one process per worker, started by the first Attach and shared, so registering costs a control-socket
round trip (~1 ms), not a LiteLLM start-up.

Then Attach proves the model is live (§2: it sits right before Atomize for this), through exactly the route the
scorer's calls will take: first by asking the proxy whether the provider lists the model for the real key (its
``GET /models``: one round trip, no tokens, no generation latency; at a 1 s endpoint this took a second off every
run's critical path), and when it does not (no listing, a refused key, an unknown model, a LiteLLM-routed provider)
by one ``max_tokens=1`` completion (``benchwright.llm.sut.run_sut``). A dead endpoint, a refused key or an unknown model
fails the phase with the provider's answer in plain words, so the run ends ``error`` at Attach instead of erroring
every task. The probe's cost (a few tokens, when it spends any) is not recorded: it belongs to no task, and
cost.model is the sum of the tasks' model spend.
"""

from __future__ import annotations

from temporalio import activity

from activities.common import Deps, in_thread, phase, started
from benchwright.errors import Unavailable
from benchwright.events import (
    ModelProxyArtifact,
    SandboxCreated,
)
from benchwright.llm.model_access import ModelAccess, check_api_base
from benchwright.llm.prices import prices_for
from benchwright.llm.sut import listed_at_proxy, probe, run_sut
from benchwright.proxy.addresses import parse_endpoints
from benchwright.proxy.litellm_config import litellm_config_yaml, secret_env_name
from benchwright.proxy.model_proxy import (
    ProxyHandle,
    load_handle,
    start_model_proxy,
    stop_model_proxy,
)
from benchwright.proxy.policy import HostPolicy
from benchwright.proxy.revocation import proxy_sandbox_id, revoke_route
from benchwright.runs.pipeline import FinishInput, PhaseInput, PhaseResult
from benchwright.schemas import ModelSpec
from benchwright.stack.procreg import ProcessRegistry
from benchwright.store.events import append_events
from benchwright.store.models import Account
from benchwright.store.policy import RunAccess, record_blocked, run_access, secret_value


def _checked_address(deps: Deps, *, run_id: str, account: Account, policy: HostPolicy, api_base: str) -> str | None:
    """The address the run's calls to ``api_base`` go to, after the account's host policy and the internal-address
    refusal (``benchwright.llm.model_access``); a refused host lands in the blocked-host log."""
    settings = deps.settings
    access = ModelAccess(policy=policy, internal_allowed=parse_endpoints(settings.model_internal_allowed),
                         trusted_local=settings.allow_local_paths and account.local_paths)
    return check_api_base(api_base, access, on_refused=lambda host: record_blocked(
        deps.engine, run_id=run_id, account_id=account.id, host=host))


async def _start_proxy(deps: Deps, *, run_id: str, spec: ModelSpec, access: RunAccess | None = None) -> ProxyHandle:
    """Check where the run's calls go, then register its route (with its real key, read here and handed over in
    the same thread call). ``access``: the run's access as its Attach read it (else read here)."""

    def register() -> ProxyHandle:
        account, policy, _ = access or run_access(deps.engine, run_id=run_id)
        address = _checked_address(deps, run_id=run_id, account=account, policy=policy, api_base=spec.api_base) \
            if spec.api_base else None
        value = None
        if spec.secret is not None:
            value = secret_value(deps.engine, account_id=account.id, name=spec.secret)
        return start_model_proxy(run_dir=deps.run_dir(run_id), spec=spec, secret_value=value,
                                 registry=ProcessRegistry(deps.settings.data_dir),
                                 linger_s=deps.settings.proxy_linger_s, connect_address=address)

    return await in_thread(register)


async def live_proxy(deps: Deps, *, run_id: str, spec: ModelSpec) -> ProxyHandle:
    """The run's route for Materialize: the one Attach registered, or the same route registered again at this
    worker's proxy if the proxy died with the worker that started it (proxies never outlive their worker)."""
    handle = load_handle(deps.run_dir(run_id))
    if handle is not None and handle.alive() and handle.control is not None:
        return handle
    return await _start_proxy(deps, run_id=run_id, spec=spec)


class AttachActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="attach")
    async def attach(self, inp: PhaseInput) -> PhaseResult:
        spec = inp.launch.model
        reading = in_thread(run_access, self.deps.engine, run_id=inp.run_id)  # read fresh: policies change
        async with started(reading) as access, phase(self.deps, inp) as scope:
            secret_env = secret_env_name(spec.secret) if spec.secret else None
            handle = await _start_proxy(self.deps, run_id=inp.run_id, spec=spec, access=await access)
            # The run's route is its proxy "sandbox": one per run, in a process shared with the worker's other runs.
            scope.emit("proxy", SandboxCreated(
                sandbox_id=proxy_sandbox_id(handle, inp.run_id), role="proxy", backend="local",
                instance_size="shared-process", isolation="process",
                metadata={"benchwright_role": "proxy", "port": handle.port, "pid": handle.pid}))
            await self._probe(inp, handle)
            config = litellm_config_yaml(spec, secret_env=secret_env)
            scope.emit("artifact", ModelProxyArtifact(model_id=spec.identifier, litellm_config_yaml=config))
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, control=scope.control,
                           detail={"model_proxy": True})

    async def _probe(self, inp: PhaseInput, proxy: ProxyHandle) -> None:
        """The liveness probe; on failure the route just registered is revoked (the workflow only revokes routes of
        runs whose Attach completed) before the phase fails with the probe's plain-words error."""
        if await listed_at_proxy(proxy):
            return
        settings = self.deps.settings
        sut = run_sut(inp.launch.model, prices=prices_for(inp.launch.model), proxy=proxy, concurrency=1,
                      timeout_s=settings.sut_probe_timeout_s, retries=settings.sut_probe_retries)
        try:
            await probe(sut, spec=inp.launch.model)
        except Unavailable:
            await in_thread(stop_model_proxy, self.deps.run_dir(inp.run_id))
            raise
        finally:
            await sut.aclose()

    @activity.defn(name="stop_model_proxy")
    async def stop_proxy(self, inp: FinishInput) -> None:
        """At the run's end: revoke its route and bill it (``benchwright.proxy.revocation.revoke_route``). Runs
        started since issue 25 revoke it in ``finish_run`` instead; older histories call this."""
        events = await in_thread(revoke_route, self.deps.settings, self.deps.run_dir(inp.run_id), inp.run_id)
        if events:
            await in_thread(append_events, self.deps.engine, inp.run_id, events)
