"""Egress control for work/task sandboxes: the per-account host policy and the proxy that enforces it (§11)."""

from benchwright.proxy.egress import BlockedHostRecorder, EgressProxy, InMemoryBlockedLog
from benchwright.proxy.policy import HostPolicy, HostRule, decide, normalize_host

__all__ = [
    "BlockedHostRecorder",
    "EgressProxy",
    "HostPolicy",
    "HostRule",
    "InMemoryBlockedLog",
    "decide",
    "normalize_host",
]
