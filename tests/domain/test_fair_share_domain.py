"""The worker's fair share between accounts (``benchwright.security.fair_share.FairShare``), driven step by step: a fake
clock, the event loop's lateness handed in, calls released one at a time. No sleeps, no timings."""

from __future__ import annotations

import asyncio

import pytest

from benchwright.security.fair_share import FairShare


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def settle() -> None:
    """Let every task that can run, run (admissions are handed over through futures)."""
    for _ in range(10):
        await asyncio.sleep(0)


class Calls:
    """Model calls held open until released, in the order they were admitted."""

    def __init__(self, share: FairShare) -> None:
        self.share = share
        self.admitted: list[str] = []
        self.open: dict[str, list[asyncio.Event]] = {}
        self.tasks: list[asyncio.Task[None]] = []

    def ask(self, account: str, n: int = 1) -> None:
        for _ in range(n):
            self.tasks.append(asyncio.create_task(self._call(account)))

    async def _call(self, account: str) -> None:
        async with self.share.call(account):
            self.admitted.append(account)
            done = asyncio.Event()
            self.open.setdefault(account, []).append(done)
            await done.wait()

    async def end(self, account: str, n: int = 1) -> None:
        for _ in range(n):
            self.open[account].pop(0).set()
        await settle()


async def test_a_flooding_account_is_cut_back_and_the_light_one_is_admitted_at_once() -> None:
    clock = Clock()
    share = FairShare(lag_target_s=0.05, min_calls=4, clock=clock)
    share.set_quota("a", 100)
    share.set_quota("b", 100)
    calls = Calls(share)

    calls.ask("a", 40)  # alone, A is bounded by its quota only: all 40 go
    await settle()
    assert share.in_flight("a") == 40
    share.observe_lag(1.0)  # a late loop with one account active changes nothing
    assert share.caps == {} and share.call_limit("a") == 100

    share.enter("b")  # B's run starts on this worker (its first phase); it has used nothing yet
    share.observe_lag(1.0)  # the loop is late: A, which used it far more, is cut to the floor at once
    assert share.caps == {"a": 4} and share.call_limit("b") == 100
    calls.ask("a", 30)  # A keeps asking: its calls wait for its own
    await settle()
    assert share.in_flight("a") == 40

    calls.ask("b", 15)  # B's calls all go at once, past A's 30 waiting ones
    await settle()
    assert share.in_flight("b") == 15 and calls.admitted[40:] == ["b"] * 15
    share.observe_lag(1.0)  # still late: A has used the worker most (40 calls against 15), B is not the one cut
    assert share.caps == {"a": 4}

    await calls.end("a", 39)  # A's calls end: its waiting ones go only while it is under its cut
    assert share.in_flight("a") == 4 and calls.admitted.count("a") == 43
    share.observe_lag(1.0)
    assert share.caps == {"a": 4}  # never under the floor
    await calls.end("b", 15)
    share.observe_lag(0.0)  # the loop answers in time: the cut grows back (by an eighth, at least one call)
    await settle()
    assert share.caps == {"a": 5} and share.call_limit("a") == 5 and share.in_flight("a") == 5

    share.leave("b")
    clock.now += share.linger_s  # B has nothing left on the worker: A is alone again, its waiting calls go
    share.observe_lag(1.0)
    await settle()
    assert share.caps == {} and share.call_limit("a") == 100
    assert calls.admitted.count("a") == 70
    await calls.end("a", share.in_flight("a"))
    await asyncio.gather(*calls.tasks)
    assert share.peak("b") == 15


async def test_an_account_not_far_heavier_is_cut_by_halves_once_each_cut_took_effect() -> None:
    """Beside an account that has used the worker more than a quarter as much, the heaviest is halved step by
    step (each once the last took effect), down to the floor: two busy accounts end near equal shares."""
    clock = Clock()
    share = FairShare(lag_target_s=0.05, min_calls=4, clock=clock)
    share.set_quota("a", 100)
    share.set_quota("b", 100)
    calls = Calls(share)
    calls.ask("a", 40)
    calls.ask("b", 15)
    await settle()
    share.observe_lag(1.0)  # A used 40, B 15: A is the heaviest but not four times B
    assert share.caps == {"a": 20}
    share.observe_lag(1.0)  # not cut again before the last cut took effect (A still has 40 in flight)
    assert share.caps == {"a": 20}
    await calls.end("a", 20)
    share.observe_lag(1.0)  # the cut took effect and the loop is still late: halved again
    assert share.caps == {"a": 10}
    await calls.end("a", 10)
    share.observe_lag(1.0)
    await calls.end("a", 5)
    share.observe_lag(1.0)
    assert share.caps == {"a": 4}  # never under the floor
    await calls.end("a", 5)
    await calls.end("b", 15)
    await asyncio.gather(*calls.tasks)


async def test_two_heavy_accounts_are_cut_in_turn_and_grow_back_to_their_quotas() -> None:
    """Whoever used the worker most lately is the one cut (used calls fade with a half-life); against a slow
    model the loop keeps up and both grow back to their own quotas."""
    clock = Clock()
    share = FairShare(min_calls=2, half_life_s=10.0, clock=clock)
    share.set_quota("a", 64)
    share.set_quota("b", 48)
    calls = Calls(share)
    calls.ask("a", 64)
    calls.ask("b", 48)
    await settle()
    share.observe_lag(1.0)
    assert share.caps == {"a": 32}
    await calls.end("a", 32)  # A is at its cut; B has now used less than A: A is cut again
    share.observe_lag(1.0)
    assert share.caps == {"a": 16}
    clock.now += 10.0  # a half-life later A's 64 calls count for 32, B's 48 for 24
    calls.ask("b", 20)
    await calls.end("b", 20)  # B's next 20 calls: B has used the most lately (44 against 32)
    assert share.used("b") > share.used("a")
    share.observe_lag(1.0)
    assert share.caps == {"a": 16, "b": 24}
    for _ in range(40):
        share.observe_lag(0.0)
    assert share.caps == {} and share.call_limit("a") == 64 and share.call_limit("b") == 48
    await calls.end("a", 32)
    await calls.end("b", 48)
    await asyncio.gather(*calls.tasks)


async def test_phases_are_shared_out_only_while_several_accounts_are_active() -> None:
    clock = Clock()
    # two accounts active: two phases each (phases not counted in their use: neither is lighter, neither yields)
    share = FairShare(phase_slots=4, start_weight=0.0, clock=clock)
    entered: list[str] = []

    async def phase(account: str) -> None:
        await share.enter_phase(account)
        entered.append(account)

    share.enter("a")
    a_first = [asyncio.create_task(phase("a")) for _ in range(6)]  # alone: no bound
    await settle()
    assert entered == ["a"] * 6
    share.enter("b")  # two accounts: two phases each
    a_more = [asyncio.create_task(phase("a")) for _ in range(3)]
    b_phase = asyncio.create_task(phase("b"))
    await settle()
    assert entered == ["a"] * 6 + ["b"]  # B's phase went past A's three waiting ones
    for _ in range(5):
        share.leave_phase("a")
    await settle()
    assert entered.count("a") == 7  # A at 1 + 1 admitted: its share of two
    a_more[2].cancel()  # a waiting phase cancelled (its activity was) takes nothing with it
    await settle()
    share.leave_phase("b")
    share.leave("b")
    clock.now += share.linger_s
    share.leave_phase("a")
    share.observe_lag(0.0)  # B gone: A alone again, its waiting phase goes
    await settle()
    assert entered.count("a") == 8 and share.in_flight("a", "phases") == 2
    await asyncio.gather(*a_first, *a_more[:2], b_phase)
    with pytest.raises(asyncio.CancelledError):
        await a_more[2]


async def test_an_account_with_a_run_running_is_active_before_its_first_activity() -> None:
    """B's launch is read from the store (``set_running``): A is cut while B's workflow has not yet reached a
    worker, and only then."""
    share = FairShare(min_calls=2, clock=Clock())
    share.set_quota("a", 100)
    calls = Calls(share)
    calls.ask("a", 40)
    await settle()
    share.set_running({"a"})
    share.observe_lag(1.0)
    assert share.caps == {}
    share.set_running({"a", "b"})
    share.observe_lag(1.0)
    assert share.active() == {"a", "b"} and share.caps == {"a": 2}  # B has used nothing: A to the floor
    share.set_running({"a"})
    share.observe_lag(1.0)
    assert share.caps == {}
    await calls.end("a", 40)
    await asyncio.gather(*calls.tasks)


async def test_a_lighter_accounts_phases_and_batch_starts_go_first() -> None:
    """While B (lighter: fewer model calls and phases admitted lately) has a phase or a batch start in flight, or ended
    one within ``yield_s``, A (heavier) starts none; B never waits for A. A batch start ends at its first call."""
    clock = Clock()
    share = FairShare(phase_slots=4, yield_s=1.0, start_weight=10.0, clock=clock)
    entered: list[str] = []

    async def phase(account: str) -> None:
        await share.enter_phase(account)
        entered.append(account)

    share.enter("a")
    a_first = [asyncio.create_task(phase("a")) for _ in range(3)]  # alone: no bound
    await settle()
    share.enter("b")
    a_more = [asyncio.create_task(phase("a")) for _ in range(2)]
    b_phase = asyncio.create_task(phase("b"))
    await settle()
    assert entered == ["a"] * 3 + ["b"]  # B at once, past A's waiting two
    assert share.used("a") > share.used("b") and share.yields("a") and not share.yields("b")
    for _ in range(3):
        share.leave_phase("a")
    await settle()
    assert entered.count("a") == 3 and share.phase_limit("a") == 0  # A's share is free, yet A yields to B
    share.leave_phase("b")
    clock.now += 0.5  # B between two phases (its workflow scheduling the next): A still waits
    share.observe_lag(0.0)
    await settle()
    assert entered.count("a") == 3

    async def batch(account: str) -> bool:
        await share.enter_phase(account)
        start = share.starting(account)
        entered.append(f"{account} batch")
        async with share.call(account):
            return start.open

    b_batch = asyncio.create_task(batch("b"))  # B's batch start holds its phase admission until its first call
    await settle()
    assert entered[-1] == "b batch" and await b_batch is False and share.in_flight("b", "phases") == 0
    clock.now += 0.9  # the start ended 0.9 s ago: within yield_s
    share.observe_lag(0.0)
    await settle()
    assert entered.count("a") == 3
    clock.now += 0.2
    share.observe_lag(0.0)  # B quiet for yield_s: A's waiting phases go, up to its share of two
    await settle()
    assert entered.count("a") == 5 and not share.yields("a")
    await asyncio.gather(*a_first, *a_more, b_phase)


async def test_a_batch_start_is_held_until_its_first_call_or_its_end() -> None:
    share = FairShare(phase_slots=2)
    share.enter("a")
    share.enter("b")

    async def batch() -> None:
        await share.enter_phase("a")
        start = share.starting("a")
        assert share.in_flight("a", "phases") == 1
        start.end()
        start.end()  # once only
        assert share.in_flight("a", "phases") == 0

    await asyncio.create_task(batch())
    await share.enter_phase("a")  # not in a batch's start: a call gives nothing back
    async with share.call("a"):
        assert share.in_flight("a", "phases") == 1
    share.leave_phase("a")


async def test_alone_an_account_runs_alone_phase_slots_phases_at_once() -> None:
    """Twenty runs launched together set up ``alone_phase_slots`` at a time: the next account to arrive waits behind
    those few, not twenty. A second account then shares the slots out as above."""
    share = FairShare(phase_slots=2, alone_phase_slots=3, clock=Clock())
    entered: list[str] = []

    async def phase(account: str) -> None:
        await share.enter_phase(account)
        entered.append(account)

    share.enter("a")
    runs = [asyncio.create_task(phase("a")) for _ in range(20)]
    await settle()
    assert entered == ["a"] * 3
    share.leave_phase("a")
    await settle()
    assert entered == ["a"] * 4 and share.in_flight("a", "phases") == 3
    for _ in range(19):
        share.leave_phase("a")
        await settle()
    assert entered == ["a"] * 20
    await asyncio.gather(*runs)


async def test_a_lighter_account_setting_up_a_run_cuts_the_heavier_to_the_floor_at_once() -> None:
    """B's run appearing in the store (its launch) cuts A's calls to ``min_calls`` there and then, however punctual
    the loop, and the cut lasts while B sets up (its arrival or a phase within ``yield_s``). Once B's set-up is
    over, A is back at its quota at once, its waiting calls admitted."""
    clock = Clock()
    share = FairShare(min_calls=4, yield_s=1.0, clock=clock)
    share.set_quota("a", 100)
    calls = Calls(share)
    calls.ask("a", 40)
    await settle()
    share.set_running({"a"})
    share.set_running({"a", "b"})  # B launched: no lag observed yet, A cut all the same
    assert share.caps == {"a": 4} and share.yields("a")
    calls.ask("a", 10)
    await calls.end("a", 38)  # A's calls drain to the floor; its new ones wait
    assert share.in_flight("a") == 4 and calls.admitted.count("a") == 42
    share.observe_lag(0.0)  # a punctual loop grows no cut while B sets up
    assert share.caps == {"a": 4}

    share.enter("b")  # B's first phase, 0.5 s after its launch
    clock.now += 0.5
    await share.enter_phase("b")
    clock.now += 0.9  # its arrival is past yield_s; its phase, in flight, still cuts A
    share.observe_lag(0.0)
    assert share.caps == {"a": 4}
    share.leave_phase("b")
    clock.now += 0.9  # between two phases: still B's set-up
    share.observe_lag(0.0)
    assert share.caps == {"a": 4}

    calls.ask("b", 20)  # B calls the model: its set-up is over once yield_s has passed since its last phase
    clock.now += 0.2
    share.observe_lag(0.0)
    await settle()
    assert share.caps == {} and share.call_limit("a") == 100
    assert share.in_flight("a") == 12 and share.in_flight("b") == 20  # A's waiting calls went at once
    await calls.end("a", 12)
    await calls.end("b", 20)
    await asyncio.gather(*calls.tasks)


async def test_a_lighter_accounts_phase_cuts_the_heavier_when_it_is_admitted() -> None:
    """Without the store's word (B's run started before this worker read it), B's phase admitted on this worker cuts A
    at once, not at the next lag probe; and what was running when the worker first read the store arrives from
    nowhere: it cuts nothing."""
    clock = Clock()
    share = FairShare(min_calls=2, clock=clock)
    share.set_quota("a", 50)
    calls = Calls(share)
    calls.ask("a", 30)
    await settle()
    share.set_running({"a", "b"})  # the worker's first reading: nothing arrived
    assert share.caps == {}
    share.enter("b")
    await share.enter_phase("b")
    assert share.caps == {"a": 2}
    share.leave_phase("b")
    share.leave("b")
    await calls.end("a", 30)
    await asyncio.gather(*calls.tasks)
