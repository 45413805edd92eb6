"""Exec a program that dies with the process that started it: ``python -E -s -S _lifeline.py PARENT PROGRAM ARGS``.

Sets ``PR_SET_PDEATHSIG = SIGKILL`` (kept across ``execve``), checks that ``PARENT`` is still its parent (it may
have died before the flag was set), then becomes ``PROGRAM``. Used for the model proxy, which holds a provider key
and must never outlive its worker; a script rather than ``preexec_fn``, which is unsafe in a threaded worker.
Standard library only, no site packages: it runs in the proxy's bare environment in a few milliseconds.
"""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    parent, program = int(argv[1]), argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        sys.stderr.write(f"lifeline: prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}\n")
        return 1
    if os.getppid() != parent:
        sys.stderr.write("lifeline: the parent exited before the child started\n")
        return 1
    os.execvp(program[0], program)
    return 1  # not reached: execvp replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv))
