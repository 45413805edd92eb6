"""The worker's fair share between accounts (``benchwright.quotas.FairShare``), driven step by step: a fake clock,
the event loop's lateness handed in, calls released one at a time. No sleeps, no timings."""

from __future__ import annotations

import asyncio

import pytest

from benchwright.quotas import FairShare


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


async def test_a_flooding_account_is_held_to_its_share_and_the_other_is_admitted_at_once() -> None:
    clock = Clock()
    share = FairShare(phase_slots=4, lag_target_s=0.05, min_calls=2, clock=clock)
    share.set_quota("a", 100)
    share.set_quota("b", 100)
    calls = Calls(share)

    calls.ask("a", 40)  # alone, A is bounded by its quota only: all 40 go
    await settle()
    assert share.in_flight("a") == 40 and share.capacity is None
    share.observe_lag(1.0)  # a late loop with one account active changes nothing
    assert share.capacity is None and share.call_limit("a") == 100

    share.enter("b")  # B's run starts on this worker (its first phase)
    share.observe_lag(1.0)  # the loop is late: the shared capacity is cut from what is in flight
    assert share.capacity == 20 and share.call_limit("a") == 10 and share.call_limit("b") == 10
    share.observe_lag(1.0)  # not cut again before the last cut took effect (A still has 40 in flight)
    assert share.capacity == 20
    calls.ask("a", 30)  # A keeps asking: its calls wait for its own
    await settle()
    assert share.in_flight("a") == 40

    calls.ask("b", 15)  # B's calls go at once up to its share, past A's 30 waiting ones
    await settle()
    assert share.in_flight("b") == 10 and calls.admitted[40:] == ["b"] * 10

    await calls.end("a", 35)  # A's calls end: its waiting ones go only while it is under its share
    assert share.in_flight("a") == 10 and share.in_flight("b") == 10
    await calls.end("b", 3)  # B's own waiting calls take B's freed admissions, not A's
    assert share.in_flight("b") == 10 and calls.admitted.count("b") == 13

    share.observe_lag(1.0)  # still late, and the last cut took effect: cut again, down to the floor at most
    assert share.capacity == 10 and share.call_limit("a") == 5
    share.observe_lag(0.0)  # the loop answers in time: the capacity grows by one call per active account
    assert share.capacity == 12 and share.call_limit("a") == 6

    await calls.end("b", 10)
    await calls.end("b", 2)
    share.leave("b")
    clock.now += share.linger_s  # B has nothing left on the worker: A is alone again
    share.observe_lag(1.0)
    await settle()
    assert share.capacity is None and share.call_limit("a") == 100
    assert share.in_flight("a") == 10 + 25  # A's 25 waiting calls all went at once
    assert share.peak("b") == 10
    await calls.end("a", 35)
    await asyncio.gather(*calls.tasks)
    assert calls.admitted.count("a") == 70 and calls.admitted.count("b") == 15


async def test_shares_grow_to_the_quotas_when_the_loop_keeps_up() -> None:
    """Against a slow model the loop is idle: two accounts' shares grow back to their own quotas."""
    clock = Clock()
    share = FairShare(min_calls=2, clock=clock)
    share.set_quota("a", 8)
    share.set_quota("b", 6)
    share.enter("a")
    share.enter("b")
    share.observe_lag(1.0)
    assert share.capacity == 4  # nothing in flight: the floor, two per account
    for _ in range(10):
        share.observe_lag(0.0)
    assert share.capacity == 14 and share.call_limit("a") == 7 and share.call_limit("b") == 6


async def test_phases_are_shared_out_only_while_several_accounts_are_active() -> None:
    clock = Clock()
    share = FairShare(phase_slots=4, clock=clock)
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
