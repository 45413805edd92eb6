"""Load checks already passed: Atomize need not start a sandbox to load a scorer that loaded there before.

Atomize load-checks task_impl.py in the run's work sandbox (its scorer runtime loads the file and reports ready)
before accepting it. The check's outcome depends on nothing but what the runtime sees: the filesystem it starts
from (the snapshot the phases before Atomize left; snapshots are content-addressed, so its id is its content), the
runtime (``runner.py``), the scorer's source, and the interpreter and backend that run them. A run that brings the
same of each as an earlier one on this worker (the same benchmark against another model, a repeated evaluation)
would start a sandbox and a runtime for an answer already known: about 0.15 s of the launch's path to its first
model call.

``LoadChecks`` remembers the checks that passed on this worker, by that content and the account (one account's runs
never learn, even by timing, what another's loaded). A remembered check lets Atomize make its snapshot from files
(``snapshot_files``: the same files, so the same snapshot id) without a sandbox. Failed checks are not remembered:
a scorer that did not load is checked again, and reported again, every time. Import-time code that behaves
differently on a later load (it reads the clock, the network) is still caught: the Materialize batch's runtime
loads the file again before any task, and a load failure there ends the batch with the reason.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path

from benchwright.fingerprint import sha256_hex
from benchwright.scoring.host import RUNNER

RUNNER_SHA256 = hashlib.sha256(Path(RUNNER).read_bytes()).hexdigest()
"""The scorer runtime this worker puts in its sandboxes (an upgraded worker's checks are its own)."""

MAX_REMEMBERED = 4096
"""Checks kept per worker (least recently used dropped first): a key is ~64 bytes, so at most ~0.5 MB."""


def load_check_key(*, account_id: str, backend: str, python: str, base_snapshot: str | None, runner_sha256: str,
                   impl_sha256: str) -> str:
    """The content a load check's outcome depends on, and whose it is."""
    return sha256_hex({"account": account_id, "backend": backend, "python": python, "base": base_snapshot,
                       "runner": runner_sha256, "impl": impl_sha256})


class LoadChecks:
    """The load checks that passed on this worker (one per worker process: ``AtomizeActivities`` holds it)."""

    def __init__(self, *, size: int = MAX_REMEMBERED) -> None:
        self.size = size
        self._passed: OrderedDict[str, None] = OrderedDict()

    def passed(self, key: str) -> bool:
        if key in self._passed:
            self._passed.move_to_end(key)
            return True
        return False

    def remember(self, key: str) -> None:
        self._passed[key] = None
        self._passed.move_to_end(key)
        while len(self._passed) > self.size:
            self._passed.popitem(last=False)
