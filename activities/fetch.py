"""Fetch: copy the dataset into the run's work directory, and make the first work-sandbox snapshot hold it →
FetchArtifact{source, sha256, bytes}, SnapshotCreated(fetch).

The worker does the fetching (nothing untrusted runs here), so the snapshot is made from the file directly rather
than through a live sandbox (measured: ~45 ms of a ~0.5 s run went to creating and killing one to write a file)."""

from __future__ import annotations

import json

from temporalio import activity

from activities.common import Deps, in_thread, phase
from activities.sandboxes import snapshot_files
from benchwright.datasets import fetch_dataset
from benchwright.events import FetchArtifact
from benchwright.pipeline import PhaseInput, PhaseResult


class FetchActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="fetch")
    async def fetch(self, inp: PhaseInput) -> PhaseResult:
        async with phase(self.deps, inp) as scope:
            workdir = self.deps.workdir(inp.run_id)
            fetched = await in_thread(fetch_dataset, source=inp.launch.dataset, dest_dir=workdir,
                                      allow_local_paths=self.deps.settings.allow_local_paths)
            (workdir / "fetch.json").write_text(json.dumps({"path": fetched.path.name, "format": fetched.format}))
            await snapshot_files(self.deps, {fetched.path.name: await in_thread(fetched.path.read_bytes)},
                                 run_id=inp.run_id, phase="fetch", invocation=inp.invocation)
            scope.emit("artifact", FetchArtifact(source=inp.launch.dataset, sha256=fetched.sha256, bytes=fetched.bytes,
                                                 format=fetched.format))
        return PhaseResult(phase=inp.phase, invocation=inp.invocation, detail={"bytes": fetched.bytes},
                           control=scope.control)
