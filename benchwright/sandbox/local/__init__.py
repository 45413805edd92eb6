"""The local sandbox backend (Linux namespaces, cgroups or rlimits, a content-addressed snapshot store) as a package:

* ``backend``: :class:`LocalBackend`, the sandbox's life and its start path (the isolation design is its docstring);
* ``process``: :class:`LocalProcess`, a command running in a sandbox;
* ``cgroups``, ``relay`` (the egress forwarder's host side), ``snapshots``, ``util``: the backend's parts;
* ``_nsexec.py``: the stdlib-only helper script the backend runs by path to enter and set up the namespaces.
"""

from __future__ import annotations

from benchwright.sandbox.local.backend import EGRESS_PORT, ROOT_LINKS_KEY, LocalBackend, settle_kills
from benchwright.sandbox.local.process import LocalProcess
from benchwright.sandbox.local.util import WORK_INSIDE

__all__ = ["EGRESS_PORT", "ROOT_LINKS_KEY", "WORK_INSIDE", "LocalBackend", "LocalProcess", "settle_kills"]
