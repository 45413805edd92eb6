"""Fetch: copy the dataset into the run's work directory, and make the first work-sandbox snapshot hold it →
FetchArtifact{source, sha256, bytes, format, file}, SnapshotCreated(fetch). The artifact is how the phases after
Fetch (on any worker) learn which work file is the dataset and its format: nothing is written beside it.

The worker does the fetching outside any sandbox, so the source is untrusted input: the account's host policy,
the internal-address refusal, the operator's endpoints and the local-path rules all apply here
(``benchwright.data.dataset_access``), and every refused host lands in the run's blocked-host log. The snapshot is made
from the file directly rather than through a live sandbox (measured: ~45 ms of a ~0.5 s run went to creating and
killing one to write a file).

A URL dataset a public run already fetched is a cache hit (``benchwright.runs.phase_cache``): nothing is downloaded, as
long as the account's host policy allows the URL's host. A pinned launch's ``registry:`` dataset is the subset
snapshot it pinned, copied from the blob store.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
from temporalio import activity

from activities.common import Deps, in_thread, not_cached, phase, started
from activities.driving import fetch_source, resolved_source
from benchwright.data.dataset_access import DatasetAccess, LocalPathRules, is_url
from benchwright.data.datasets import Fetched, detect_format, fetch_dataset
from benchwright.errors import DatasetError
from benchwright.events import FetchArtifact
from benchwright.fingerprint import sha256_hex
from benchwright.proxy.addresses import parse_endpoints
from benchwright.proxy.policy import decide, normalize_host
from benchwright.registry.blobs import BlobStore
from benchwright.registry.catalog import REGISTRY_SOURCE
from benchwright.registry.pinned import fetch_pinned
from benchwright.runs.phase_cache import PhaseCache
from benchwright.runs.pipeline import PhaseInput, PhaseResult
from benchwright.sandbox.lifecycle import snapshot_files
from benchwright.store.policy import record_blocked, run_access


def fetch_input_hash(source: str) -> str:
    """Fetch's phase fingerprint: the source alone (model-free; the bytes' sha256 is in its artifact)."""
    return sha256_hex({"phase": "fetch", "source": source})


class FetchActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def _access(self, run_id: str) -> tuple[str, DatasetAccess, str]:
        """The run's account, what its run may fetch, read fresh from the store (policies change between runs), and
        its backend."""
        settings = self.deps.settings
        account, policy, backend = run_access(self.deps.engine, run_id=run_id)
        return account.id, DatasetAccess(
            policy=policy,
            internal_allowed=parse_endpoints(settings.egress_internal_allowed),
            local=LocalPathRules.from_settings(settings, account_local_paths=account.local_paths),
            total_timeout_s=settings.dataset_fetch_timeout_s), backend

    @activity.defn(name="fetch")
    async def fetch(self, inp: PhaseInput) -> PhaseResult:
        source = inp.launch.dataset or await resolved_source(self.deps, inp.run_id)  # a prompt launch: Find's
        cache = PhaseCache(engine=self.deps.engine, settings=self.deps.settings, workdir=self.deps.workdir(inp.run_id),
                           inp=inp, input_hash=fetch_input_hash(source))
        hit = await cache.lookup() if is_url(source) else None
        if hit is None and inp.cached_only:
            raise not_cached(inp)
        async with started(in_thread(self._access, inp.run_id)) as reading, phase(self.deps, inp) as scope:
            workdir = self.deps.workdir(inp.run_id)
            account_id, access, backend = await reading

            def on_refused(host: str) -> None:  # runs in fetch_dataset's thread
                record_blocked(self.deps.engine, run_id=inp.run_id, account_id=account_id, host=host)

            if hit is not None:
                await in_thread(_check_policy, source, access, on_refused)
                _, detail = await cache.replay(scope, hit)
            else:
                cache.begin()
                if source.startswith(REGISTRY_SOURCE):
                    path, sha, size = await in_thread(fetch_pinned, self.deps.engine,
                                                      BlobStore.from_settings(self.deps.settings), source=source,
                                                      dest_dir=workdir)
                    fetched = Fetched(path=path, sha256=sha, bytes=size, format=detect_format(path))
                else:
                    where, access = await in_thread(fetch_source, source, access, self.deps.settings)
                    fetched = await in_thread(fetch_dataset, source=where, dest_dir=workdir, access=access,
                                              on_refused=on_refused)
                await snapshot_files(engine=self.deps.engine, settings=self.deps.settings,
                                     files={fetched.path.name: await in_thread(fetched.path.read_bytes)},
                                     run_id=inp.run_id, phase="fetch", invocation=inp.invocation, emit=scope.emit,
                                     backend=backend)
                scope.emit("artifact", FetchArtifact(source=source, sha256=fetched.sha256, bytes=fetched.bytes,
                                                     format=fetched.format, file=fetched.path.name))
                detail = {"bytes": fetched.bytes}
                await cache.record(scope, detail=detail)
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, detail=detail, control=scope.control)


def _check_policy(source: str, access: DatasetAccess, on_refused: Callable[[str], None]) -> None:
    """A cached copy is still the URL's data: the account's host policy must allow that host, as for a download.

    Raises:
        DatasetError: the policy blocks the host (recorded in the blocked-host log like a refused download).
    """
    url = httpx.URL(source)
    host = normalize_host(url.host)
    allowed, reason = decide(access.policy, host, url.port or (443 if url.scheme == "https" else 80))
    if not allowed:
        on_refused(host)
        raise DatasetError(f"fetching the dataset from {host} was refused: {host} is blocked by the account's host "
                           f"policy ({reason})", code="dataset_blocked")
