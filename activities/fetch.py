"""Fetch: copy the dataset into the run's work directory, and make the first work-sandbox snapshot hold it →
FetchArtifact{source, sha256, bytes}, SnapshotCreated(fetch).

The worker does the fetching outside any sandbox, so the source is untrusted input: the account's host policy,
the internal-address refusal, the operator's endpoints and the local-path rules all apply here
(``benchwright.dataset_access``), and every refused host lands in the run's blocked-host log. The snapshot is made
from the file directly rather than through a live sandbox (measured: ~45 ms of a ~0.5 s run went to creating and
killing one to write a file)."""

from __future__ import annotations

import json

from temporalio import activity

from activities.common import Deps, in_thread, phase
from activities.sandboxes import snapshot_files
from benchwright.dataset_access import DatasetAccess, LocalPathRules
from benchwright.datasets import fetch_dataset
from benchwright.events import FetchArtifact
from benchwright.pipeline import PhaseInput, PhaseResult
from benchwright.proxy.addresses import parse_endpoints
from benchwright.store.accounts import get_account
from benchwright.store.policy import get_policy, record_blocked
from benchwright.store.runs import get_run


class FetchActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    def _access(self, account_id: str) -> DatasetAccess:
        """What this account's run may fetch, read fresh from the store (policies change between runs)."""
        settings = self.deps.settings
        account = get_account(self.deps.engine, account_id=account_id)
        return DatasetAccess(policy=get_policy(self.deps.engine, account_id=account_id),
                             internal_allowed=parse_endpoints(settings.egress_internal_allowed),
                             local=LocalPathRules.from_settings(settings, account_local_paths=account.local_paths),
                             total_timeout_s=settings.dataset_fetch_timeout_s)

    @activity.defn(name="fetch")
    async def fetch(self, inp: PhaseInput) -> PhaseResult:
        async with phase(self.deps, inp) as scope:
            workdir = self.deps.workdir(inp.run_id)
            account_id = (await in_thread(get_run, self.deps.engine, run_id=inp.run_id)).account_id
            access = await in_thread(self._access, account_id)

            def on_refused(host: str) -> None:  # runs in fetch_dataset's thread
                record_blocked(self.deps.engine, run_id=inp.run_id, account_id=account_id, host=host)

            fetched = await in_thread(fetch_dataset, source=inp.launch.dataset, dest_dir=workdir, access=access,
                                      on_refused=on_refused)
            (workdir / "fetch.json").write_text(json.dumps({"path": fetched.path.name, "format": fetched.format}))
            await snapshot_files(self.deps, {fetched.path.name: await in_thread(fetched.path.read_bytes)},
                                 run_id=inp.run_id, phase="fetch", invocation=inp.invocation)
            scope.emit("artifact", FetchArtifact(source=inp.launch.dataset, sha256=fetched.sha256, bytes=fetched.bytes,
                                                 format=fetched.format))
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, detail={"bytes": fetched.bytes},
                           control=scope.control)
