"""This checkout's CPU per 1,000 tasks against a reference commit's, measured side by side on this machine.

Issue 25 asks for the CPU seconds of worker + API + credential proxy per 1,000 tasks at C=128 to be at most half of
what they were when it was filed (commit 8af44e2). A CPU second is not the same on two machines, or on one machine
from one hour to the next (docs/performance.md: the same commit measured 0.74 s in one session, and 1.06-1.59 s
within ten minutes in the next), so the figure is only a ratio against the reference run beside it. This bench makes
that ratio one command:

    python bench/against.py                          # this checkout against 8af44e2, C=128, 3 pairs of 5 runs
    python bench/against.py --ref <commit> --pairs 5 --repeat 5 --concurrency 32

The reference is checked out as a git worktree under the temporary directory (``bw-ref-<commit>``) with its own
``.venv``, made by its own ``dev.py`` (the first time takes a few minutes; later invocations reuse it;
``git worktree remove --force <dir>`` drops it). Each pair runs the reference's ``bench/materialize.py`` and then this
checkout's, one after the other, so that both see the machine in the same state; each prints its medians, read here.
Printed: each pair's figures, the median of the pairs' ratios with its 95 % interval (the range below 6 pairs)
against the goal (<= 0.5), and the same for the walls against the bare client.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchstack import ratio_verdict, spread

ROOT = Path(__file__).resolve().parent.parent
FILED = "8af44e2"
"""The commit that added issue 25's figures to the bench (2026-12-02): "today's" CPU in the goal."""
GOAL = 0.5
CPU_LINE = re.compile(r"\[keyless\] C=(\d+): CPU s per 1,000 tasks \(median\) worker\+api\+proxy ([\d.]+) = "
                      r"worker ([\d.]+) \+ api ([\d.]+) \+ proxy ([\d.]+)")
WALL_LINE = re.compile(r"\[keyless\] C=(\d+): Benchwright ([\d.]+) s / bare asyncio client ([\d.]+) s")


def _bounded(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an int in [low, high]."""

    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low}-{high}, got {value}")
        return value
    return parse


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def reference_checkout(ref: str) -> Path:
    """The reference commit's worktree (made once, kept for the next invocation)."""
    if not re.fullmatch(r"[0-9A-Za-z._/-]{1,100}", ref) or ref.startswith("-"):
        sys.exit(f"not a commit name: {ref!r}")
    try:
        sha = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except subprocess.CalledProcessError:
        sys.exit(f"no commit {ref!r} in {ROOT}")
    where = Path(tempfile.gettempdir()) / f"bw-ref-{sha[:12]}"
    if not (where / "dev.py").exists():
        print(f"checking out {sha[:12]} at {where} (its .venv is made on its first bench: a few minutes)", flush=True)
        _git("worktree", "add", "--force", "--detach", str(where), sha)
    return where


def figures(checkout: Path, *, concurrency: int, repeat: int) -> dict[str, float]:
    """One invocation of ``checkout``'s bench: its CPU per 1,000 tasks (and parts) and its wall against the bare
    client, at ``concurrency``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([sys.executable, "dev.py", "bench", "--concurrency", str(concurrency), "--repeat",
                           str(repeat)], cwd=checkout, env=env, capture_output=True, text=True)
    out = done.stdout
    cpu = next((m for m in CPU_LINE.finditer(out) if int(m.group(1)) == concurrency), None)
    wall = next((m for m in WALL_LINE.finditer(out) if int(m.group(1)) == concurrency), None)
    if done.returncode != 0 or cpu is None or wall is None:
        tail = "\n".join((out + done.stderr).splitlines()[-15:])
        sys.exit(f"the bench in {checkout} (exit {done.returncode}) printed no C={concurrency} figures:\n{tail}")
    total, worker, api, proxy = (float(cpu.group(i)) for i in range(2, 6))
    return {"cpu": total, "worker": worker, "api": api, "proxy": proxy,
            "wall": float(wall.group(2)), "bare": float(wall.group(3))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default=FILED, help=f"the reference commit (default {FILED}, issue 25's filing)")
    ap.add_argument("--pairs", type=_bounded(1, 20), default=3, help="reference/this invocations, interleaved")
    ap.add_argument("--repeat", type=_bounded(1, 50), default=5, help="timed runs per invocation (its median)")
    ap.add_argument("--concurrency", type=_bounded(1, 1024), default=128)
    args = ap.parse_args()
    ref = reference_checkout(args.ref)
    print(f"{args.pairs} pairs of {args.repeat} runs at C={args.concurrency}: reference {args.ref} ({ref}) then "
          f"this checkout ({ROOT}); load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    pairs = []
    for i in range(1, args.pairs + 1):
        theirs = figures(ref, concurrency=args.concurrency, repeat=args.repeat)
        ours = figures(ROOT, concurrency=args.concurrency, repeat=args.repeat)
        pairs.append((theirs, ours))
        print(f"pair {i}: CPU s per 1,000 tasks (worker+api+proxy) reference {theirs['cpu']:.2f} (worker "
              f"{theirs['worker']:.2f}, proxy {theirs['proxy']:.2f}), this {ours['cpu']:.2f} (worker "
              f"{ours['worker']:.2f}, proxy {ours['proxy']:.2f}) = {ours['cpu'] / theirs['cpu']:.2f}; wall against "
              f"the bare client {theirs['wall'] / theirs['bare']:.2f}x and {ours['wall'] / ours['bare']:.2f}x",
              flush=True)
    ratios = [ours["cpu"] / theirs["cpu"] for theirs, ours in pairs]
    print(f"CPU per 1,000 tasks at C={args.concurrency}, this / {args.ref} (median of pairs [95 % interval; the range "
          f"below 6 pairs]): {ratio_verdict(ratios, GOAL)}")
    print(f"wall against the bare client: reference {spread([t['wall'] / t['bare'] for t, _ in pairs])}x, this "
          f"{spread([o['wall'] / o['bare'] for _, o in pairs])}x")


if __name__ == "__main__":
    main()
