"""The end of a run's route at the credential proxy, as the run's ledger records it (issue 12).

The route is the run's proxy "sandbox": Attach records its SandboxCreated (``proxy_sandbox_id``); its revocation at
the run's end refuses the per-run key from then on, drops the real key, and bills the route's time and the warm
window it may leave the proxy in (``revoke_route``). Both the ``stop_model_proxy`` activity and the run's last write
(``finish_run``, which revokes and ends the run in one activity since issue 25) go through here.
"""

from __future__ import annotations

from pathlib import Path

from benchwright.events import ProxyLingerMetered, SandboxKilled
from benchwright.proxy.model_proxy import ProxyHandle, load_handle, stop_model_proxy
from benchwright.settings import Settings
from benchwright.store.events import NewEvent, event_key


def proxy_sandbox_id(handle: ProxyHandle, run_id: str) -> str:
    """The run's route as a sandbox id: unique per run although the process is shared."""
    return f"proxy-{handle.pid}-{run_id}"


def revoke_route(settings: Settings, run_dir: Path, run_id: str) -> list[NewEvent]:
    """Revoke the run's route and return its ledger entries (none if it had no route, or it was revoked before).

    The linger: a proxy left without a route stays up ``proxy_linger_s`` for the next run, then exits. The run whose
    revocation left it idle is charged that window (an upper bound: a run registering sooner ends it); a run leaving
    others behind is charged none.
    """
    handle = load_handle(run_dir)
    if handle is None:
        return []
    revoked = stop_model_proxy(run_dir)
    lifetime = revoked.lifetime_s if revoked is not None else 0.0
    linger = settings.proxy_linger_s if revoked is not None and revoked.idle else 0.0
    rate = settings.proxy_usd_per_hour / 3600
    return [
        NewEvent.of(event_key(run_id, "proxy", "killed"), SandboxKilled(
            sandbox_id=proxy_sandbox_id(handle, run_id), role="proxy", duration_ms=int(lifetime * 1000),
            cost_usd=lifetime * rate)),
        NewEvent.of(event_key(run_id, "proxy", "linger"), ProxyLingerMetered(seconds=round(linger, 3),
                                                                             cost_usd=linger * rate)),
    ]


__all__ = ["proxy_sandbox_id", "revoke_route"]
