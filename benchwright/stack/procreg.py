"""The stack's process registry: every process a stack starts, recorded under its data directory, so that nothing
outlives the stack (issue 15 item 10) and nothing outside it is ever signalled.

``DIR/procs/<pid>.json`` holds one entry: ``{kind, pid, start, group, owner, detail}``. ``start`` is the process's
start time from ``/proc/<pid>/stat`` (field 22, clock ticks after boot): an entry names a live process only while
that same process holds the PID, so a PID the kernel recycled for someone else's process is never killed. One file
per process, written atomically, so the supervisor, its workers and their model proxies record themselves without
sharing a lock; a dead process's entry is dropped the next time anyone reads the registry.

Scope is the data directory: several stacks (test stacks, say) run on one machine at once, and a stack's reaper
reads only its own ``DIR/procs``. Sandboxes are not entries here: their own ``meta.json`` (under
``DIR/sandboxes``) records their init, its supervisor and their cgroups the same way, and the local backend's
``reap`` reads it.

A process's Unix sockets live in temporary directories of its own (``owned_tempdir``), outside any data directory: a
socket's path must stay short. A process killed with SIGKILL leaves its directories behind; the reapers remove
those whose process is gone (``sweep_owned_tempdirs``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import stat
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Kind = Literal["supervisor", "temporal", "worker", "api", "model_proxy"]
_POLL_S = 0.05


def proc_starttime(pid: int) -> int | None:
    """Start time (clock ticks after boot) of the live, non-zombie process ``pid``; None if there is none."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


@dataclass(frozen=True)
class ProcEntry:
    kind: Kind
    pid: int
    start: int
    """``/proc/<pid>/stat`` start time when recorded: the entry's identity beyond the reusable PID."""
    group: bool
    """Whether the process leads its own process group (started with a new session): then the group is signalled,
    so helpers it started in its group go with it."""
    owner: int | None = None
    """PID of the process that started it (a model proxy's worker), for "stop what I started"."""
    detail: dict[str, Any] = field(default_factory=dict)

    def alive(self) -> bool:
        return proc_starttime(self.pid) == self.start

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process (or its group), only if it is still the recorded process."""
        if not self.alive():
            return
        with contextlib.suppress(OSError):
            if self.group and os.getpgid(self.pid) == self.pid:
                os.killpg(self.pid, signum)
            else:
                os.kill(self.pid, signum)


class ProcessRegistry:
    """The entries of one data directory's stack (see the module docstring)."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = Path(data_dir) / "procs"

    def record(self, *, kind: Kind, pid: int, group: bool, owner: int | None = None,
               detail: dict[str, Any] | None = None) -> ProcEntry | None:
        """Record a process just started; None if it has already exited (nothing left to track)."""
        start = proc_starttime(pid)
        if start is None:
            return None
        entry = ProcEntry(kind=kind, pid=pid, start=start, group=group, owner=owner, detail=dict(detail or {}))
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.dir / f".{pid}.{secrets.token_hex(4)}.tmp"
        tmp.write_text(json.dumps(asdict(entry)))
        os.replace(tmp, self.dir / f"{pid}.json")
        return entry

    def forget(self, entry: ProcEntry) -> None:
        path = self.dir / f"{entry.pid}.json"
        with contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_text()).get("start") == entry.start:
                path.unlink()

    def live(self, *, kinds: tuple[Kind, ...] | None = None, owner: int | None = None) -> list[ProcEntry]:
        """Live recorded processes (optionally of these kinds / started by ``owner``); dead entries are dropped."""
        found = []
        try:
            paths = sorted(self.dir.glob("*.json"))
        except OSError:
            return []
        for path in paths:
            try:
                entry = ProcEntry(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                path.unlink(missing_ok=True)  # a torn or foreign file names no process we could verify
                continue
            if not entry.alive():
                self.forget(entry)
                continue
            if (kinds is None or entry.kind in kinds) and (owner is None or entry.owner == owner):
                found.append(entry)
        return found

    def stop(self, entries: list[ProcEntry], *, timeout_s: float) -> list[ProcEntry]:
        """SIGTERM these processes, SIGKILL whichever is still alive after ``timeout_s``; wait for them to go.

        Returns the entries that were alive when asked to stop.
        """
        stopping = [e for e in entries if e.alive() and e.pid != os.getpid()]
        for entry in stopping:
            entry.signal(signal.SIGTERM)
        stopped = wait_gone(stopping, timeout_s=timeout_s)
        if not stopped:
            for entry in stopping:
                entry.signal(signal.SIGKILL)
            wait_gone(stopping, timeout_s=5.0)
        for entry in stopping:
            if not entry.alive():
                self.forget(entry)
        return stopping


def wait_gone(entries: list[ProcEntry], *, timeout_s: float) -> bool:
    """Poll until none of ``entries`` is alive (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while any(e.alive() for e in entries):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


# ----------------------------------------------------------------------------- a process's temporary directories ---

_OWNED = re.compile(r"bw-[a-z]+-(\d+)-")
SOCKET_NAME_MAX = 16
"""The longest socket file name put in an ``owned_tempdir`` (``control.sock``)."""
_SUN_PATH_MAX = 107
"""A Unix socket's path in bytes: ``sun_path`` is 108, its terminating NUL included."""
SHORT_BASE = Path("/tmp")
"""Where ``owned_tempdir`` goes when the temporary directory's own path leaves a socket under it too long."""


def owned_tempdir(kind: str) -> Path:
    """A new private (0700) temporary directory named for this process: ``bw-<kind>-<pid>-<random>``.

    For Unix sockets, whose path must stay short (``sun_path`` is 108 bytes), so they cannot live under a data
    directory. It is made in the process's temporary directory (``TMPDIR``), or in ``SHORT_BASE`` when a socket of
    ``SOCKET_NAME_MAX`` bytes would not fit under that one (a deep ``TMPDIR``; ``bind`` would fail with "AF_UNIX path
    too long"). The owner removes it when done; one killed with SIGKILL cannot, and ``sweep_owned_tempdirs`` removes
    it once no process holds the PID.
    """
    prefix = f"bw-{kind}-{os.getpid()}-"
    base = Path(tempfile.gettempdir())
    # mkdtemp adds 8 random characters to the prefix; then a separator and the socket's name.
    if len(os.fsencode(base / prefix)) + 8 + 1 + SOCKET_NAME_MAX > _SUN_PATH_MAX:
        base = SHORT_BASE
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def sweep_owned_tempdirs() -> list[Path]:
    """Remove the ``owned_tempdir`` directories (in this process's temporary directory and ``SHORT_BASE``, owned by
    its user) whose process is gone; returns them. A directory whose PID the kernel gave to another process waits for
    that one."""
    removed = []
    me = os.getuid()
    for base in dict.fromkeys((Path(tempfile.gettempdir()), SHORT_BASE)):
        for path in base.glob("bw-*-*-*"):
            match = _OWNED.match(path.name)
            if match is None or int(match[1]) == os.getpid() or proc_starttime(int(match[1])) is not None:
                continue
            try:
                st = path.lstat()
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != me:
                continue
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
