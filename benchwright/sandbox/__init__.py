"""Sandboxes for untrusted code (scorers, drivers, task commands): the backend protocol and its backends.

``base`` defines the protocol every backend implements (``SandboxBackend``) and its records; ``local`` is the
Linux-namespaces backend for one machine. See ``local``'s module docstring for how isolation works.
"""

from benchwright.sandbox.base import (
    ROLES,
    ExecLimits,
    ExecResult,
    IsolationUnavailable,
    SandboxBackend,
    SandboxError,
    SandboxInfo,
    SandboxNotFound,
    SandboxPathError,
    SandboxProcess,
    proxy_env,
)
from benchwright.sandbox.local import EGRESS_PORT, LocalBackend, LocalProcess

__all__ = [
    "EGRESS_PORT",
    "ROLES",
    "ExecLimits",
    "ExecResult",
    "IsolationUnavailable",
    "LocalBackend",
    "LocalProcess",
    "SandboxBackend",
    "SandboxError",
    "SandboxInfo",
    "SandboxNotFound",
    "SandboxPathError",
    "SandboxProcess",
    "proxy_env",
]
