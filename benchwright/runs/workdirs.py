"""A run's work directory on a worker, ``DIR/runs/<run id>/work``, and its removal once the run ended.

The directory is a cache: every phase brings it to the run's recorded work files from the blob store when they are
missing or differ (``benchwright.runs.handoff.restore``), and a fork restores its parent's the same way before it
copies what it inherits (``activities/fork.py``). Kept, each worker that ran a phase of a run held the run's work
files for good: about twice its dataset (the dataset as fetched and as tasks), run after run.

A worker removes them (``sweep_ended_workdirs``, every ``workdir_sweep_s``): the work directory of a run that ended
more than ``workdir_linger_s`` ago, or that the store does not know, goes; so does its run directory once nothing
else is in it (the credential proxy's handle is removed by the route sweep, ``benchwright.proxy.model_proxy``). A
reader of an ended run's files (a fork) holds its run directory (``holding``) while it reads: the sweep passes a held
one by and takes it on a later round.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from benchwright.proxy.model_proxy import EndedAt

WORK = "work"
LOCK = "work.lock"
"""Held shared by a reader of the work directory (``holding``), exclusively by the sweep that removes it."""
_ALONE = {WORK, LOCK, "proxy.lock"}
"""What a run directory may still hold when the sweep removes it whole (``proxy.lock`` serialised proxy starts)."""


@contextlib.contextmanager
def holding(run_dir: Path) -> Iterator[None]:
    """Keep the sweep off ``run_dir``'s work directory until the block ends (a shared lock: readers do not wait for
    each other). Taken on the lock file the directory holds now: one the sweep unlinked while this waited for it
    is let go and the new one taken, so a reader never holds a lock the next sweep does not see."""
    run_dir.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(run_dir / LOCK, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                current = os.stat(run_dir / LOCK).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # the sweep removed the directory meanwhile: the reader restores it afresh
        run_dir.mkdir(parents=True, exist_ok=True)
    try:
        yield
    finally:
        os.close(fd)


def sweep_ended_workdirs(*, runs_dir: Path, ended_at: EndedAt, linger_s: float) -> int:
    """Remove the work directories of runs that ended more than ``linger_s`` ago (or that the store does not know:
    ``ended_at`` gives them 0.0); returns how many were removed. One listing of ``runs_dir`` and one ``ended_at``
    call (one query) for the run directories that still have one, none when none has."""
    try:
        with os.scandir(runs_dir) as entries:
            candidates = [entry.name for entry in entries
                          if entry.is_dir(follow_symlinks=False) and os.path.isdir(os.path.join(entry.path, WORK))]
    except FileNotFoundError:
        return 0
    if not candidates:
        return 0
    ended = ended_at(candidates)
    now = time.time()
    removed = 0
    for run_id in candidates:
        at = ended.get(run_id)
        if at is not None and now >= at + linger_s:
            removed += _remove(runs_dir / run_id)
    return removed


def _remove(run_dir: Path) -> bool:
    """``run_dir``'s work directory gone (and the run directory, when nothing else is left in it), unless a reader
    holds it; whether its work directory was removed."""
    try:
        fd = os.open(run_dir / LOCK, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        return False  # removed meanwhile (another worker sweeping the same data directory)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a fork is reading it: the next sweep takes it
        shutil.rmtree(run_dir / WORK, ignore_errors=True)
        if set(os.listdir(run_dir)) <= _ALONE:
            shutil.rmtree(run_dir, ignore_errors=True)  # the lock goes with it: a reader waiting on it takes a new one
        return True
    finally:
        os.close(fd)
