"""Privileged helper of the local sandbox backend: builds a sandbox's namespaces and runs commands inside them.

Run by :mod:`benchwright.sandbox.local` as a plain script (``python -E -s -S _nsexec.py init|enter CONFIG``): it
imports only the standard library, and as little of it as it can (no json, typing, enum: it runs on every command
and starts in ~40 ms), all up front, so it keeps working after ``pivot_root`` (the interpreter's own prefix stays
mounted at the same path inside the sandbox anyway). Its config is a root-only marshal file it deletes on reading.

``init`` (one per sandbox, runs as root on the host):
    1. ``unshare(NEWPID)``, then fork: the child is PID 1 of the sandbox's PID namespace (the "init"); the parent
       stays outside as its supervisor (it records the init's PID, reaps the init and dies with nothing left).
       The child then ``unshare(NEWNS|NEWNET|NEWIPC|NEWUTS)``s for itself: the supervisor must stay in the host's
       mount namespace, because ``pivot_root`` re-roots *every* process of the namespace it runs in, and a
       supervisor sharing it would lose the host paths (``ctl/pids.json``) mid-write when the init got there first.
    2. The init makes every mount private, builds a new root on a tmpfs out of read-only bind mounts of a whitelist
       (``/usr``, ``/bin``, ``/lib*``, the Python prefixes, a few ``/etc`` files), a private ``/dev``, a fresh
       ``/proc`` for the new PID namespace, a private ``/tmp`` tmpfs and the sandbox's ``work/`` at ``/sandbox``,
       ``pivot_root``s into it and detaches the old root: nothing of the host's tree is left to reach, even by
       unmounting things. It then remounts ``/`` read-only, sets the hostname and brings up ``lo``.
    3. It reports ``ok`` (or the exact step that failed) to the supervisor, which prints one JSON line for the
       backend, and then serves: it reaps orphans and, when egress is configured, runs the in-sandbox forwarder
       (127.0.0.1:PORT inside the sandbox's network namespace -> the Unix socket the backend bind-mounted at
       ``/run/benchwright/egress.sock``).
    4. A warm sandbox's supervisor also holds a lifeline to the worker that made it (``owner_lifeline``): if that
       worker dies before a run claims the sandbox, the supervisor kills the init (``_watch_owner``).

``enter`` (one per exec/spawn):
    helper (host PID namespace) -- joins the sandbox's ipc/uts/net/pid/mnt namespaces and chroots to its root; is
    |                              the watchdog (wall clock, total CPU from the cgroup) and writes status lines
    +- mid (sandbox PID ns)     -- ``unshare(NEWPID|NEWNS)``: every exec gets its own nested PID namespace
       +- reaper (PID 1 there)  -- mounts a /proc that shows only this exec; waits for the target, reports its status
          +- target             -- joins the exec's cgroups, sets rlimits, drops to the sandbox's unprivileged uid
                                   (no groups, no capabilities, no_new_privs) and execs argv with exactly ``env``
    Each level has PDEATHSIG=SIGKILL on its parent, so killing the helper (what the backend does on a timeout)
    kills the reaper, and the death of a PID namespace's PID 1 makes the kernel kill everything else in it: no
    background process of an exec outlives it. The target is not PID 1 itself, so rlimit signals (SIGXCPU) and
    ordinary signal semantics apply to it.

With ``mode == "none"`` (the operator opted into running without isolation) ``enter`` skips all namespace steps:
the target runs in its own session (the watchdog kills the process group) as the calling user.
"""

from __future__ import annotations

import _signal as signal  # the C module: the "signal" wrapper would import enum (~15 ms per command)
import ctypes
import marshal
import os
import resource
import select
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: importing typing would cost ~20 ms on every command
    import fcntl  # these five are imported by _load_init_modules, in the sandbox init only
    import json
    import socket
    import struct
    import threading
    from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

# pivot_root(2) has no glibc wrapper; these are its syscall numbers. Elsewhere we fall back to MS_MOVE + chroot.
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217, "i686": 217,
                   "armv7l": 218}

EGRESS_SOCKET_INSIDE = "/run/benchwright/egress.sock"
WORK_INSIDE = "/sandbox"
_PUMP_CHUNK = 65536
_MAX_EGRESS_CONNECTIONS = 128

_libc = ctypes.CDLL(None, use_errno=True)


def _load_init_modules() -> None:
    """Modules only the sandbox init needs: imported once per sandbox, not on every command's path."""
    global fcntl, json, socket, struct, threading
    import fcntl
    import json
    import socket
    import struct
    import threading


def _dumps(obj: Any) -> str:
    """JSON for the few plain values the helper reports (the json module costs ~30 ms of import per command)."""
    if obj is None:
        return "null"
    if obj is True or obj is False:
        return "true" if obj else "false"
    if isinstance(obj, (int, float)):
        return repr(obj)
    if isinstance(obj, str):
        out = []
        for ch in obj:
            if ch in "\\\"":
                out.append("\\" + ch)
            elif ord(ch) < 0x20:
                out.append(f"\\u{ord(ch):04x}")
            else:
                out.append(ch)
        return '"' + "".join(out) + '"'
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{_dumps(str(k))}: {_dumps(v)}" for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ", ".join(_dumps(v) for v in obj) + "]"
    return _dumps(str(obj))


def _call(result: int, what: str) -> int:
    if result == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _b(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


def unshare(flags: int) -> None:
    _call(_libc.unshare(ctypes.c_int(flags)), f"unshare(0x{flags:x})")


def setns(fd: int, what: str) -> None:
    _call(_libc.setns(ctypes.c_int(fd), ctypes.c_int(0)), f"setns({what})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _call(_libc.mount(_b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data)),
          f"mount({source or fstype} -> {target})")


def umount2(target: str, flags: int) -> None:
    _call(_libc.umount2(_b(target), ctypes.c_int(flags)), f"umount2({target})")


def prctl(option: int, arg: int) -> None:
    _call(_libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)), f"prctl({option})")


def sethostname(name: str) -> None:
    raw = name.encode()
    _call(_libc.sethostname(raw, ctypes.c_size_t(len(raw))), "sethostname")


def pivot_into(new_root: str) -> None:
    """Make ``new_root`` the root of this mount namespace and detach the old root entirely."""
    os.chdir(new_root)
    number = _SYS_PIVOT_ROOT.get(os.uname().machine)
    if number is not None:
        # pivot_root(".", "."): the old root ends up stacked under the new one and is then lazily detached.
        _call(_libc.syscall(ctypes.c_long(number), b".", b"."), "pivot_root")
        umount2(".", MNT_DETACH)
    else:
        mount(".", "/", None, MS_MOVE)
        os.chroot(".")
    os.chdir("/")


def proc_starttime(pid: int) -> int | None:
    """Start time (clock ticks after boot) of a live, non-zombie process, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


# --------------------------------------------------------------------------------------------------------- init ---


def _mkdirs(path: str, mode: int = 0o755) -> None:
    parts = path.strip("/").split("/")
    cur = ""
    for part in parts:
        cur += "/" + part
        try:
            os.mkdir(cur, mode)
        except FileExistsError:
            pass


def _mountpoint(path: str, is_dir: bool) -> None:
    _mkdirs(os.path.dirname(path))
    if is_dir:
        _mkdirs(path)
    elif not os.path.exists(path):
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))


def _bind(src: str, dst: str, *, readonly: bool, extra: int = MS_NOSUID | MS_NODEV) -> None:
    _mountpoint(dst, os.path.isdir(src))
    # Non-recursive on purpose: whatever is mounted below src on the host stays out of the sandbox.
    mount(src, dst, None, MS_BIND)
    mount(None, dst, None, MS_REMOUNT | MS_BIND | extra | (MS_RDONLY if readonly else 0))


def _setup_root(cfg: dict[str, Any]) -> None:
    root = cfg["rootfs"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount leaks back to the host, and vice versa
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=8m")
    # /tmp first, so a read-only path that lives under the host's /tmp (extra_ro_paths) lands on top of it.
    _mkdirs(root + "/tmp")
    mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={cfg['tmp_size_mb']}m")
    for src, dst in cfg["ro_binds"]:
        _bind(src, root + dst, readonly=True)
    for target, link in cfg["symlinks"]:
        _mkdirs(os.path.dirname(root + link))
        os.symlink(target, root + link)
    for name, text in cfg["etc_files"].items():
        _mkdirs(root + "/etc")
        with open(root + "/etc/" + name, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(root + "/etc/" + name, 0o644)

    dev = root + "/dev"
    _mkdirs(dev)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for node in ("null", "zero", "full", "random", "urandom", "tty"):
        if os.path.exists("/dev/" + node):
            _bind("/dev/" + node, f"{dev}/{node}", readonly=False, extra=MS_NOSUID | MS_NOEXEC)
    _mkdirs(dev + "/shm")
    mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={cfg['shm_size_mb']}m")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    # A devpts instance of this sandbox's own (its ptys only, at most 64), for terminal programs (tmux, script);
    # a kernel that refuses it leaves the sandbox without ptys, as before.
    _mkdirs(dev + "/pts")
    try:
        mount("devpts", dev + "/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0600,max=64")
        os.symlink("pts/ptmx", f"{dev}/ptmx")
    except OSError:
        pass

    _mkdirs(root + "/proc")
    # This PID namespace's view only; hidepid=2 hides root's processes (the init) from the sandbox's uid.
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    _bind(cfg["work_dir"], root + WORK_INSIDE, readonly=False)
    _mkdirs(root + "/run")
    os.mkdir(root + "/run/benchwright", 0o700)  # root only: the sandboxed uid cannot use the socket directly
    if cfg.get("egress_socket"):
        _bind(cfg["egress_socket"], root + EGRESS_SOCKET_INSIDE, readonly=False)

    pivot_into(root)
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    sethostname(cfg.get("hostname") or "sandbox")
    _loopback_up()


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        req = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(_PUMP_CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _forward(client: socket.socket, slots: threading.BoundedSemaphore) -> None:
    try:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(EGRESS_SOCKET_INSIDE)
        except OSError:
            upstream.close()
            return
        back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
        back.start()
        _pump(client, upstream)
        back.join()
        upstream.close()
    finally:
        client.close()
        slots.release()


def _serve_egress(port: int) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    slots = threading.BoundedSemaphore(_MAX_EGRESS_CONNECTIONS)
    while True:
        client, _ = listener.accept()
        # A relay forwards whatever it reads at once: Nagle would hold a small second write (an HTTP body after its
        # head) for the peer's delayed ACK, ~40 ms a request.
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not slots.acquire(blocking=False):
            client.close()  # bounded: a sandbox cannot make its own init spawn unbounded threads
            continue
        threading.Thread(target=_forward, args=(client, slots), daemon=True).start()


def cmd_init(cfg: dict[str, Any]) -> int:
    _load_init_modules()
    log_fd = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        # NEWPID only: it applies to the children, while the other namespaces would apply to this supervisor
        # itself. Above all it must not share the init's mount namespace (see the module docstring).
        unshare(CLONE_NEWPID)
    except OSError as exc:
        print(_dumps({"ok": False, "step": "unshare", "error": str(exc), "errno": exc.errno}), flush=True)
        return 1
    rfd, wfd = os.pipe()
    lifeline_r, lifeline_w = os.pipe()  # only the supervisor holds the write end: EOF once it is gone
    owner = cfg.get("owner_lifeline")  # a warm sandbox's: see _watch_owner
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        os.close(lifeline_w)
        if owner is not None:
            os.close(owner)  # nothing inside the sandbox may read (or hold) its maker's lifeline
        step = "unshare"
        try:
            # The supervisor gone means the sandbox is gone, even if it was killed (the backend's start timeout)
            # before this prctl: then the lifeline is already at EOF and the init exits here.
            _arm_pdeathsig(lifeline_r)
            os.close(lifeline_r)
            unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS)
            step = "mount setup"
            os.setsid()
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            _setup_root(cfg)
        except BaseException as exc:  # noqa: BLE001 - every setup failure is reported, with the step that failed
            os.write(wfd, _dumps({"ok": False, "step": step, "error": str(exc),
                                  "errno": getattr(exc, "errno", None)}).encode())
            os._exit(1)
        os.write(wfd, _dumps({"ok": True}).encode())
        os.close(wfd)
        if cfg.get("egress_port"):
            threading.Thread(target=_serve_egress, args=(int(cfg["egress_port"]),), daemon=True).start()
        while True:  # PID 1: reap whatever gets orphaned into this namespace
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                time.sleep(1.0)
            except InterruptedError:
                pass
    os.close(wfd)
    os.close(lifeline_r)  # lifeline_w stays open (and unused) for as long as this supervisor lives
    # Written before anything else can go wrong, so a reaper finds the sandbox even if its creator died mid-create.
    pids = {"init_pid": pid, "init_start": proc_starttime(pid), "supervisor_pid": os.getpid(),
            "supervisor_start": proc_starttime(os.getpid())}
    tmp = cfg["pidfile"] + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(pids, fh)
        os.replace(tmp, cfg["pidfile"])
    except OSError as exc:  # e.g. a full disk: no sandbox that a reaper could not find
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        print(_dumps({"ok": False, "step": "record pids", "error": str(exc), "errno": exc.errno}), flush=True)
        return 1
    chunks = []
    while chunk := os.read(rfd, 65536):
        chunks.append(chunk)
    os.close(rfd)
    try:
        report = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        report = {}
    if not report:
        report = {"ok": False, "step": "mount setup", "error": "the sandbox init died during setup"}
    report.update(pids)
    print(_dumps(report), flush=True)
    os.dup2(log_fd, 1)  # the backend stops reading after that line
    if owner is not None and report.get("ok"):
        _watch_owner(owner, pid)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status) & 0xFF
        except InterruptedError:
            continue


def _watch_owner(fd: int, init_pid: int) -> None:
    """A warm sandbox's lifeline to the worker that made it (only that worker holds the write end), watched until
    the init exits. End of file means the worker died before a run claimed the sandbox: the init is killed, and
    with it everything in its PID namespace (a waiting runtime among it), so a killed worker leaves no warm sandbox
    running. The byte ``c`` means a run claimed it: from then on it lives as long as the run's other sandboxes do.
    (No thread: after ``unshare(CLONE_NEWPID)`` this process cannot start one.)"""
    try:
        init_exit = os.pidfd_open(init_pid)
    except OSError:
        os.close(fd)  # no pidfds (Linux < 5.3): the sandbox is reaped by the next worker, as before lifelines
        return
    try:
        while True:
            try:
                readable = select.select([fd, init_exit], [], [])[0]
            except InterruptedError:
                continue
            if init_exit in readable:
                return
            try:
                claimed = os.read(fd, 1) == b"c"
            except OSError:
                claimed = False
            if not claimed:
                try:
                    os.kill(init_pid, signal.SIGKILL)
                except OSError:
                    pass  # already gone
            return
    finally:
        os.close(fd)
        os.close(init_exit)


# -------------------------------------------------------------------------------------------------------- enter ---


def _returncode(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


def _write_status(fd: int, event: dict[str, Any]) -> None:
    try:
        os.write(fd, (_dumps(event) + "\n").encode("utf-8", "backslashreplace"))
    except OSError:
        pass


def _arm_pdeathsig(lifeline: int) -> None:
    """SIGKILL this process when its parent dies, and exit now if the helper already did (the race prctl leaves)."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    # Only the helper holds the lifeline's write end: readable (EOF) means it is gone.
    if select.select([lifeline], [], [], 0)[0]:
        os._exit(125)


class _Pipes:
    """The fds the forked levels of an exec pass down."""

    def __init__(self, status: int, rc_w: int, lifeline: int, armed_w: int, procs: list[int]) -> None:
        self.status = status
        self.rc_w = rc_w
        self.lifeline = lifeline
        self.armed_w = armed_w
        self.procs = procs


def _become_target(cfg: dict[str, Any], procs_fds: list[int]) -> None:
    """Turn this (forked, still root) process into the sandboxed command; never returns."""
    try:
        for fd in procs_fds:
            os.write(fd, b"0")  # "0" = the writing task: no PID translation across namespaces needed
        lim = cfg["limits"]
        cpu = int(lim["cpu_seconds"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at the limit, SIGKILL a second later
        fsize = int(lim["max_file_mb"]) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if cfg.get("rlimit_as"):
            mem = int(lim["memory_mb"]) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        if cfg.get("rlimit_nproc"):
            n = int(lim["max_processes"])
            resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
        os.setsid()
        os.chdir(cfg["cwd"])
        if cfg.get("uid") is not None:
            os.setgroups([])
            os.setresgid(cfg["gid"], cfg["gid"], cfg["gid"])
            os.setresuid(cfg["uid"], cfg["uid"], cfg["uid"])  # drops every capability: a plain unprivileged user
        prctl(PR_SET_NO_NEW_PRIVS, 1)  # no setuid binary can give any of it back
        os.umask(0o022)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)  # Python changed these; the target starts with the defaults
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        argv = cfg["argv"]
        os.execvpe(argv[0], argv, cfg["env"])
    except BaseException as exc:  # noqa: BLE001
        try:
            os.write(2, f"benchwright sandbox: cannot run {cfg['argv'][:1]}: {exc}\n".encode())
        finally:
            os._exit(127)


def _reaper(cfg: dict[str, Any], p: _Pipes) -> None:
    """PID 1 of the exec's own PID namespace: give it its own /proc, run the target, report how it ended."""
    try:
        _arm_pdeathsig(p.lifeline)
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        # hidepid=2: the target (another uid) cannot even see this root-owned reaper, only its own processes.
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    except BaseException as exc:  # noqa: BLE001
        _write_status(p.status, {"event": "error", "error": f"exec setup failed: {exc}"})
        os._exit(125)
    os.write(p.armed_w, b"1")  # every level above is armed too: from here on, killing the helper kills all
    for fd in (p.armed_w, p.lifeline, p.status):
        os.close(fd)
    pid = os.fork()
    if pid == 0:
        os.close(p.rc_w)
        # No PDEATHSIG needed: when this reaper (PID 1) dies, the kernel kills everything in its namespace.
        _become_target(cfg, p.procs)
    for fd in p.procs:
        os.close(fd)
    while True:
        try:
            got, status = os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(125)
        except InterruptedError:
            continue
        if got == pid:
            os.write(p.rc_w, str(_returncode(status)).encode())
            os._exit(0)  # PID 1 leaving takes every leftover process of the exec with it


def _mid(cfg: dict[str, Any], p: _Pipes) -> None:
    try:
        _arm_pdeathsig(p.lifeline)
        unshare(CLONE_NEWPID | CLONE_NEWNS)
    except BaseException as exc:  # noqa: BLE001
        _write_status(p.status, {"event": "error", "error": f"exec setup failed: {exc}"})
        os._exit(125)
    pid = os.fork()
    if pid == 0:
        _reaper(cfg, p)
    for fd in (p.rc_w, p.armed_w, p.lifeline, p.status, *p.procs):
        os.close(fd)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            os._exit(_returncode(status) & 0xFF)
        except InterruptedError:
            continue


def _stat_alive(fd: int | None, start: int) -> bool:
    """Whether the process whose /proc/PID/stat ``fd`` is still runs (reads fail once it has been reaped)."""
    if fd is None:
        return False
    try:
        raw = os.pread(fd, 4096, 0)
    except OSError:
        return False
    fields = raw[raw.rindex(b")") + 2:].split()
    return fields[0] not in (b"Z", b"X") and int(fields[19]) == start


def _read_int(fd: int | None) -> int | None:
    if fd is None:
        return None
    try:
        raw = os.pread(fd, 4096, 0).decode()
    except OSError:
        return None
    for line in raw.splitlines():  # cpuacct.usage: "N"; cpu.stat (v2): "usage_usec N"
        parts = line.split()
        if len(parts) == 1:
            return int(parts[0])
        if parts and parts[0] == "usage_usec":
            return int(parts[1]) * 1000
    return None


def _oom_kills(fd: int | None) -> int:
    if fd is None:
        return 0
    try:
        raw = os.pread(fd, 4096, 0).decode()
    except OSError:
        return 0
    for line in raw.splitlines():  # v1 memory.oom_control and v2 memory.events both carry "oom_kill N"
        parts = line.split()
        if len(parts) == 2 and parts[0] == "oom_kill":
            return int(parts[1])
    return 0


class _State:
    reason: str | None = None
    child: int | None = None


_state = _State()


def _kill_child(ns_mode: bool) -> None:
    if _state.child is None:
        return
    for kill in ((os.kill,) if ns_mode else (os.killpg, os.kill)):
        try:
            # ns mode: PDEATHSIG chain mid -> reaper (PID 1 of the exec's namespace) -> the whole exec.
            # none mode: the target's session (it called setsid), or the target itself if not yet.
            kill(_state.child, signal.SIGKILL)
        except OSError:
            pass


def cmd_enter(cfg: dict[str, Any]) -> int:
    status_fd = int(cfg["status_fd"])
    ns_mode = cfg["mode"] == "namespaces"

    def _on_signal(_sig: int, _frame: Any) -> None:
        _state.reason = _state.reason or "terminated"
        _kill_child(ns_mode)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)

    # Everything on the host side is opened before entering the sandbox: afterwards none of it is reachable.
    procs_fds = [os.open(p, os.O_WRONLY | os.O_CLOEXEC) for p in cfg.get("cgroup_procs", [])]
    cpu_fd = os.open(cfg["cpu_usage"], os.O_RDONLY | os.O_CLOEXEC) if cfg.get("cpu_usage") else None
    oom_fd = os.open(cfg["oom_file"], os.O_RDONLY | os.O_CLOEXEC) if cfg.get("oom_file") else None
    oom_before = _oom_kills(oom_fd)
    init_pid = cfg.get("init_pid")
    init_stat_fd = None
    try:
        if ns_mode:
            # Kept open to tell later whether the sandbox was killed: once inside, /proc is the sandbox's own.
            init_stat_fd = os.open(f"/proc/{init_pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
            if not _stat_alive(init_stat_fd, cfg["init_start"]):
                raise RuntimeError("the sandbox's init process is gone (sandbox killed?)")
            ns_fds = [(name, os.open(f"/proc/{init_pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC))
                      for name in ("ipc", "uts", "net", "pid", "mnt")]
            root_fd = os.open(f"/proc/{init_pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            if not _stat_alive(init_stat_fd, cfg["init_start"]):  # the fds must belong to that very process
                raise RuntimeError("the sandbox's init process is gone (sandbox killed?)")
            for name, fd in ns_fds:
                setns(fd, name)
                os.close(fd)
            os.fchdir(root_fd)
            os.chroot(".")
            os.close(root_fd)
    except BaseException as exc:  # noqa: BLE001
        _write_status(status_fd, {"event": "error", "error": f"cannot enter the sandbox: {exc}"})
        return 125

    rc_r, rc_w = os.pipe()  # the reaper's word on how the target ended (exit code, or minus the signal)
    lifeline_r, lifeline_w = os.pipe()  # EOF for the levels below once this helper is gone
    armed_r, armed_w = os.pipe()  # a byte once every level below has PDEATHSIG armed
    pipes = _Pipes(status_fd, rc_w, lifeline_r, armed_w, procs_fds)
    child = os.fork()
    if child == 0:
        for fd in (rc_r, lifeline_w, armed_r):
            os.close(fd)
        if ns_mode:
            _mid(cfg, pipes)
        else:
            _arm_pdeathsig(lifeline_r)
            os.write(armed_w, b"1")
            for fd in (status_fd, rc_w, lifeline_r, armed_w):
                os.close(fd)
            _become_target(cfg, procs_fds)
    _state.child = child
    if _state.reason:  # a signal came before there was a child to kill
        _kill_child(ns_mode)
    for fd in (rc_w, lifeline_r, armed_w, *procs_fds):
        os.close(fd)
    armed = b""
    while True:
        try:
            armed = os.read(armed_r, 1)
            break
        except InterruptedError:
            continue
    os.close(armed_r)
    if armed:
        _write_status(status_fd, {"event": "started", "pid": child})

    cpu_limit_ns = int(cfg["limits"]["cpu_seconds"]) * 1_000_000_000
    deadline = time.monotonic() + float(cfg["wall_seconds"])
    pidfd = os.pidfd_open(child)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    while armed:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _state.reason = _state.reason or "wall_clock"
            _kill_child(ns_mode)
            break
        step = min(remaining, 0.1) if cpu_fd is not None else remaining
        try:
            if poller.poll(max(1, int(step * 1000 + 1))):
                break
        except InterruptedError:
            continue
        usage = _read_int(cpu_fd)
        if usage is not None and usage > cpu_limit_ns:
            _state.reason = _state.reason or "cpu"  # all processes of the exec together used up the CPU seconds
            _kill_child(ns_mode)
            break
    if not armed:
        _kill_child(ns_mode)  # setup failed below us (the error is already on the status pipe)
    while True:
        try:
            _, status, rusage = os.wait4(child, 0)
            break
        except InterruptedError:
            continue
    if not ns_mode:
        try:
            os.killpg(child, signal.SIGKILL)  # leftovers of the target's session
        except OSError:
            pass
    returncode = _returncode(status)
    if ns_mode:
        raw = os.read(rc_r, 64)
        returncode = int(raw) if raw else -signal.SIGKILL  # no word from the reaper: it was killed
    os.close(rc_r)
    if not armed:
        return 125
    cpu_s = rusage.ru_utime + rusage.ru_stime
    usage = _read_int(cpu_fd)
    if usage is not None:
        cpu_s = max(cpu_s, usage / 1e9)
    _write_status(status_fd, {
        "event": "final", "returncode": returncode, "reason": _state.reason, "cpu_seconds": round(cpu_s, 3),
        "oom_kills": _oom_kills(oom_fd) - oom_before,
        "init_alive": _stat_alive(init_stat_fd, cfg["init_start"]) if ns_mode else True,
    })
    return returncode


def main(argv: list[str]) -> int:
    command, config_path = argv[1], argv[2]
    with open(config_path, "rb") as fh:
        cfg = marshal.load(fh)  # written by the same interpreter; marshal needs no import (json costs ~30 ms)
    try:
        os.unlink(config_path)  # it holds the target's environment: gone as soon as it is read
    except OSError:
        pass
    if command == "init":
        return cmd_init(cfg)
    if command == "enter":
        returncode = cmd_enter(cfg)
        if returncode < 0:  # mirror a death by signal, so the helper's own status matches the target's
            for sig in {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, -returncode} - {signal.SIGKILL, signal.SIGSTOP}:
                try:
                    signal.signal(sig, signal.SIG_DFL)
                except (OSError, ValueError):
                    pass
            os.kill(os.getpid(), -returncode)
            return 128 - returncode
        return returncode
    print(f"unknown command {command!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
