"""A worker's threads on one CPU and its children on every CPU (``benchwright.stack.cpu``), against the real kernel.

Pinning changes the calling thread for good, so each case runs in a Python process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from benchwright.errors import InvalidInput
from benchwright.settings import Settings
from benchwright.stack.cpu import cpu_list, pin_threads

REPO = Path(__file__).resolve().parents[2]

_CASE = textwrap.dedent("""
    import asyncio, json, os, subprocess, sys, threading
    from benchwright.stack.cpu import pin_threads, spawning

    CHILD = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    every = sorted(os.sched_getaffinity(0))
    seen = {"every": every, "cpu": pin_threads("auto")}
    thread = threading.Thread(target=lambda: seen.update(thread=sorted(os.sched_getaffinity(0))))
    thread.start()
    thread.join()
    seen["child_unwrapped"] = json.loads(subprocess.run(CHILD, capture_output=True, text=True).stdout)
    with spawning():
        seen["child_spawning"] = json.loads(subprocess.run(CHILD, capture_output=True, text=True).stdout)
    seen["after"] = sorted(os.sched_getaffinity(0))

    async def interleaved():
        first_out = asyncio.Event()

        async def spawn(first):
            with spawning():
                proc = await asyncio.create_subprocess_exec(*CHILD, stdout=asyncio.subprocess.PIPE)
                out, _ = await proc.communicate()
                if not first:  # the second spawn ends after the first, whose end must not re-pin the thread
                    await first_out.wait()
                    seen["between"] = sorted(os.sched_getaffinity(0))
            if first:
                first_out.set()
            return json.loads(out)

        return await asyncio.gather(spawn(True), spawn(False))

    seen["interleaved"] = asyncio.run(interleaved())
    seen["after_interleaved"] = sorted(os.sched_getaffinity(0))
    print(json.dumps(seen))
""")


def _case(script: str, *, cpus: set[int] | None = None) -> dict:
    prefix = f"import os; os.sched_setaffinity(0, {sorted(cpus)!r})\n" if cpus else ""
    done = subprocess.run([sys.executable, "-c", prefix + script], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_the_worker_threads_share_one_cpu_and_what_it_spawns_gets_every_cpu_back() -> None:
    every = os.sched_getaffinity(0)
    if len(every) < 2:
        pytest.skip(f"this machine gives the tests one CPU ({cpu_list(every)}): nothing to pin away from")
    seen = _case(_CASE)
    cpu = max(every)
    assert seen["cpu"] == cpu
    assert seen["thread"] == [cpu], "a thread started after the pin inherits it"
    assert seen["child_unwrapped"] == [cpu], "a child inherits its spawner's CPUs: the reason spawning() exists"
    assert seen["child_spawning"] == sorted(every)
    assert seen["after"] == [cpu]
    assert seen["interleaved"] == [sorted(every)] * 2
    assert seen["between"] == sorted(every), "a spawn still under way keeps the thread unpinned"
    assert seen["after_interleaved"] == [cpu]


def test_auto_pins_nothing_where_the_worker_may_run_on_one_cpu_only() -> None:
    one = min(os.sched_getaffinity(0))
    seen = _case(textwrap.dedent("""
        import json, os, subprocess, sys
        from benchwright.stack.cpu import pin_threads, spawning
        cpu = pin_threads("auto")
        with spawning():
            child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                                   capture_output=True, text=True).stdout
        print(json.dumps({"cpu": cpu, "child": json.loads(child), "off": pin_threads("off")}))
    """), cpus={one})
    assert seen == {"cpu": None, "child": [one], "off": None}


def test_a_cpu_the_worker_may_not_run_on_is_refused_naming_the_ones_it_may() -> None:
    allowed = os.sched_getaffinity(0)
    outside = max(allowed) + 1
    with pytest.raises(InvalidInput, match=rf"BENCHWRIGHT_WORKER_CPU={outside}: .* CPUs {cpu_list(allowed)} only") \
            as refused:
        pin_threads(str(outside))
    assert refused.value.code == "worker_cpu_not_allowed"
    assert os.sched_getaffinity(0) == allowed, "refused before anything changed"


@pytest.mark.parametrize("value", ["-1", "1.5", "all", "12345", "0x1", " 1", ""])
def test_worker_cpu_settings_outside_off_auto_or_a_cpu_number_are_refused(value: str) -> None:
    with pytest.raises(ValidationError):
        Settings(worker_cpu=value)


def test_worker_cpu_settings_that_are_accepted() -> None:
    assert [Settings(worker_cpu=v).worker_cpu for v in ("off", "auto", "0", "17")] == ["off", "auto", "0", "17"]
    # the field's default, whatever BENCHWRIGHT_WORKER_CPU the test's environment holds
    assert Settings.model_fields["worker_cpu"].default == "off", "a worker alone pins nothing unless asked"


def test_cpu_lists_read_as_the_kernel_writes_them() -> None:
    assert cpu_list({0}) == "0"
    assert cpu_list({0, 1, 2, 3, 6}) == "0-3,6"
    assert cpu_list({5, 1, 2, 9, 10}) == "1-2,5,9-10"
