"""The worker's fair share between accounts (issue 23): each account's model calls in flight held to its
``model_calls`` quota (``benchwright.security.quotas``), and while other accounts have work on the same worker, each
held to an equal share of what the worker can serve (its model calls, and its pipeline phases), so one account's 20
runs at C=128 cannot take the worker's event loop and cores from another account's run. One ``FairShare`` per
worker process; ``activities.fair_share`` tells it whose each activity is, ``GatedSut`` puts a batch's calls
through it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from benchwright.security.quotas import MAX_QUOTA, RUNNING
from benchwright.store.db import reader
from benchwright.store.models import Run, table_of

if TYPE_CHECKING:
    from benchwright.llm.sut import SutClient, SutReply


class _Share:
    """One account's admissions of one kind (model calls, or phases): how many hold one, who waits (first come,
    first served within the account)."""

    def __init__(self, account: str, kind: str) -> None:
        self.account = account
        self.kind = kind
        self.in_flight = 0
        self.peak = 0
        self.ended_at = -1e18
        """When one of its admissions was last given back (``FairShare.yield_s``)."""
        self.waiters: deque[asyncio.Future[None]] = deque()

    def take(self) -> None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)


class Start:
    """A Materialize batch's start (its sandbox restored, its scorer runtime started: CPU-heavy, like a phase) held as
    one of its account's phase admissions until the batch asks for its first model call (``FairShare.call``) or
    ``end`` is called, whichever comes first (``activities.fair_share`` also ends it after a bound: a batch that
    makes no model call through the share, a harness bridge's, must not hold it for its whole run)."""

    def __init__(self, share: FairShare, account: str) -> None:
        self.share = share
        self.account = account
        self.open = True

    def end(self) -> None:
        if self.open:
            self.open = False
            self.share.leave_phase(self.account)


_STARTING: ContextVar[Start | None] = ContextVar("benchwright_fair_start", default=None)
"""The batch start of the activity this code runs in (set by ``FairShare.starting``), ended by its first call."""


class FairShare:
    """One worker's fair share between accounts (issue 23): while several accounts have work on this worker, none
    may take it from the others.

    The scarce thing on a busy worker is its one event loop (and the cores under it): an account's twenty runs at
    C=128 against a fast model keep it busy enough that another account's every phase, workflow task and store write
    waits behind theirs. Two bounds share it out, each only while more than one account is *active* (has a run
    running, read from the store every ``RUNNING_POLL_S``; or an activity running on this worker, or had one within
    ``linger_s``: ``enter``/``leave``, called for every activity by ``activities.fair_share``):

    * **Model calls.** While the event loop answers later than ``lag_target_s`` (``observe_lag``, fed every
      ``LAG_PROBE_S`` by ``watch``), the active account that has used the worker most lately (model calls admitted,
      decayed with a ``half_life_s`` half-life) has its calls in flight cut back: to half of what it has in
      flight, then halved again once that took effect, down to ``min_calls``; straight to ``min_calls`` if it has
      used ``dominant_ratio`` times more than every other active account (a light run beside it may last a second,
      most of which halving step by step took). While the loop answers within half
      of the target, every cut account's bound grows again (by an eighth, at least one call). An account that
      has used little (a 200-task run beside another's twenty) is never the one cut: its calls go at once, up to
      its quota. If it comes to use more than the other, it becomes the one cut, so two heavy accounts end near
      equal shares. Against a slow model (real providers: seconds per call) the loop keeps up and nothing is cut.
    * **Phases.** Each account runs at most ``phase_slots // accounts`` (at least one) of its pipeline phases and
      Materialize batch starts (``starting``) at once; its others wait for its own (an account's twenty runs
      starting at once no longer run twenty sandboxes' set-up beside the other account's one). And the lighter
      account goes first: while an active account that has used the worker less lately (``used``) is setting up a
      run (has a phase or batch start in flight or waiting, ended one within ``yield_s``, the gap between a run's
      phases while its workflow schedules the next, or had a run appear in the store within ``yield_s``), a heavier
      account starts none (those under way finish) and its model calls in flight are cut to ``min_calls`` at once,
      whatever the loop's lag. Every hop of a run's set-up (a store write, a workflow task, a phase's next step)
      waits its turn on the worker's one event loop; a heavier account calling flat out keeps that queue ~20 ms deep
      (below the lag target), and twenty such hops cost a light run as much as its whole solo time. Once the lighter
      account's set-up is over, the cut goes (the heavier account is back at its quota at once, not grown back
      call by call). Every phase or batch start admitted counts ``start_weight`` model calls in ``used``. The
      lightest account never waits for another, so one always goes; a 200-task run's phases beside another
      account's twenty runs run on a worker (and cores) that the twenty's calls and sandbox starts no longer crowd.

    Alone, an account is bounded only by its quota and ``alone_phase_slots`` (its phases and batch starts at once;
    the worker sets it to its cores: twenty runs launched together set up a few at a time, and an account
    arriving next waits behind those few instead of twenty; the twenty also end sooner than with twice as many).
    Waiters are admitted first come, first served within their account; an account's calls never wait for
    another account's calls, and its phases and batch starts wait for another account's only while that one is
    lighter (above).
    """

    LAG_PROBE_S = 0.1
    RUNNING_POLL_S = 0.1

    def __init__(self, *, phase_slots: int = 2, lag_target_s: float = 0.05, min_calls: int = 4,
                 linger_s: float = 2.0, half_life_s: float = 10.0, yield_s: float = 1.0, start_weight: float = 10.0,
                 alone_phase_slots: int = MAX_QUOTA, dominant_ratio: float = 4.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.phase_slots = phase_slots
        self.alone_phase_slots = alone_phase_slots
        self.dominant_ratio = dominant_ratio
        self.yield_s = yield_s
        self.start_weight = start_weight
        self.lag_target_s = lag_target_s
        self.min_calls = min_calls
        self.linger_s = linger_s
        self.half_life_s = half_life_s
        self._clock = clock
        self._live: dict[str, int] = {}
        self._left_at: dict[str, float] = {}
        self._running: set[str] = set()
        self._quota: dict[str, int] = {}
        self._calls: dict[str, _Share] = {}
        self._phases: dict[str, _Share] = {}
        self.caps: dict[str, int] = {}
        """The accounts whose model calls are cut back, and to how many in flight (only while several are active)."""
        self._used: dict[str, tuple[float, float]] = {}
        """account -> (model calls admitted, decayed; when last updated)."""
        self._arrived: dict[str, float] = {}
        """account -> when it last came to have a run running (``set_running``; a run's set-up begins)."""
        self._yield_cut: set[str] = set()
        """The accounts whose calls are cut because a lighter account is setting up a run (``_cut_for_set_up``)."""
        self._running_read = False

    # -- who is active
    def active(self) -> set[str]:
        now = self._clock()
        live = {a for a, n in self._live.items() if n > 0 or now - self._left_at.get(a, -1e18) < self.linger_s}
        calling = {a for a, c in self._calls.items() if c.in_flight or c.waiters}
        return live | calling | self._running

    def set_running(self, accounts: set[str]) -> None:
        """The accounts with runs running (read from the store by ``watch``): active from their launch, before
        their workflow's first activity reaches a worker. An account that had none is setting up a run (the first
        reading is what was running before this worker started, nothing new)."""
        if self._running_read:
            now = self._clock()
            for account in set(accounts) - self._running:
                self._arrived[account] = now
        self._running = set(accounts)
        self._running_read = True
        self._rebalance()

    def enter(self, account: str) -> None:
        """An activity of ``account`` started on this worker."""
        self._live[account] = self._live.get(account, 0) + 1
        self._rebalance()

    def leave(self, account: str) -> None:
        """An activity of ``account`` ended."""
        self._live[account] = max(0, self._live.get(account, 0) - 1)
        self._left_at[account] = self._clock()
        self._rebalance()

    # -- bounds
    def set_quota(self, account: str, model_calls: int) -> None:
        """The account's ``model_calls`` quota as last read from the store (an admin's change applies at once)."""
        if self._quota.get(account) != model_calls:
            self._quota[account] = model_calls
            self._rebalance()

    def call_limit(self, account: str) -> int:
        quota = self._quota.get(account, MAX_QUOTA)
        cap = self.caps.get(account)
        return quota if cap is None else min(quota, cap)

    def phase_limit(self, account: str) -> int:
        active = self.active() | {account}
        if len(active) <= 1:
            return self.alone_phase_slots
        return 0 if self.yields(account, active) else max(1, self.phase_slots // len(active))

    def yields(self, account: str, active: set[str] | None = None) -> bool:
        """Whether ``account``'s phases and batch starts wait for a lighter account's: one that has used the worker
        less lately has one in flight or waiting, or ended one within ``yield_s``."""
        now = self._clock()
        mine = self.used(account)
        for other in (self.active() if active is None else active) - {account}:
            share = self._phases.get(other)
            busy = share is not None and (share.in_flight > 0 or bool(share.waiters)
                                          or now - share.ended_at < self.yield_s)
            arriving = now - self._arrived.get(other, -1e18) < self.yield_s
            if (busy or arriving) and self.used(other) < mine:
                return True
        return False

    def _cut_for_set_up(self, active: set[str]) -> bool:
        """Cut to ``min_calls`` the model calls of every account that yields to a lighter one setting up a run, and
        lift the cut of those that no longer do. Returns whether any account yields."""
        yielding = {a for a in active if self.yields(a, active)} if len(active) > 1 else set()
        for account in self._yield_cut - yielding:
            self.caps.pop(account, None)
        for account in yielding:
            self.caps[account] = min(self.caps.get(account, self.min_calls), self.min_calls)
        self._yield_cut = yielding
        return bool(yielding)

    def used(self, account: str) -> float:
        """The account's model calls admitted lately (each counts for less as ``half_life_s`` passes)."""
        value, at = self._used.get(account, (0.0, 0.0))
        return float(value * 0.5 ** ((self._clock() - at) / self.half_life_s))

    def observe_lag(self, lag_s: float) -> None:
        """The event loop answered ``lag_s`` late: cut the heaviest account back, or let the cut ones grow."""
        active = self.active()
        if len(active) <= 1:
            self.caps.clear()
            self._yield_cut.clear()
        elif self._cut_for_set_up(active):
            pass  # the heavier accounts are at the floor while the lighter one sets up
        elif lag_s > self.lag_target_s:
            heaviest = max(sorted(active), key=self.used)
            calls = self._calls.get(heaviest)
            in_flight = calls.in_flight if calls else 0
            cap = self.caps.get(heaviest)
            if self._dominant(heaviest, active):  # beside a light account's run, which may last a second
                self.caps[heaviest] = self.min_calls
            elif cap is None:
                self.caps[heaviest] = max(self.min_calls, in_flight // 2)
            elif in_flight <= cap:  # cut again once the last cut has taken effect
                self.caps[heaviest] = max(self.min_calls, cap // 2)
        elif lag_s < self.lag_target_s / 2:
            for account, cap in list(self.caps.items()):
                grown = cap + max(1, cap // 8)
                if grown >= self._quota.get(account, MAX_QUOTA):
                    del self.caps[account]
                else:
                    self.caps[account] = grown
        self._rebalance()

    def _dominant(self, account: str, active: set[str]) -> bool:
        """Whether ``account`` has used the worker ``dominant_ratio`` times more lately than every other active
        account: the noisy neighbour beside light ones, cut to the floor at once rather than by halves."""
        mine = self.used(account)
        return mine > 0 and all(mine >= self.dominant_ratio * self.used(other) for other in active - {account})

    async def watch(self, running: Callable[[], Coroutine[Any, Any, set[str]]] | None = None) -> None:
        """Measure the event loop's lateness every ``LAG_PROBE_S`` and feed ``observe_lag``; read the accounts with
        runs running (``running``, e.g. ``running_accounts`` in a thread) every ``RUNNING_POLL_S``; until
        cancelled."""
        reading: asyncio.Task[set[str]] | None = None
        read_at = 0.0
        try:
            while True:
                asked = time.monotonic()
                await asyncio.sleep(self.LAG_PROBE_S)
                now = time.monotonic()
                self.observe_lag(now - asked - self.LAG_PROBE_S)
                if running is None:
                    continue
                if reading is not None and reading.done():
                    if not reading.cancelled() and reading.exception() is None:  # failed: keep the last reading
                        self.set_running(reading.result())
                    reading = None
                if reading is None and now - read_at >= self.RUNNING_POLL_S:
                    reading, read_at = asyncio.create_task(running()), now  # off the probe's path
        finally:
            if reading is not None:
                reading.cancel()

    # -- admission
    def _limit(self, share: _Share) -> int:
        return self.call_limit(share.account) if share.kind == "calls" else self.phase_limit(share.account)

    def _take(self, share: _Share) -> None:
        share.take()
        weight = 1.0 if share.kind == "calls" else self.start_weight
        self._used[share.account] = (self.used(share.account) + weight, self._clock())
        if share.kind == "phases":  # a lighter account's set-up under way cuts the heavier at once
            self._cut_for_set_up(self.active())

    def _wake(self, share: _Share) -> None:
        limit = self._limit(share)
        while share.waiters and share.in_flight < limit:
            waiter = share.waiters.popleft()
            if not waiter.done():
                self._take(share)
                waiter.set_result(None)

    def _rebalance(self) -> None:
        self._cut_for_set_up(self.active())
        for share in (*self._calls.values(), *self._phases.values()):
            if share.waiters:
                self._wake(share)

    async def _acquire(self, share: _Share) -> None:
        if not share.waiters and share.in_flight < self._limit(share):
            self._take(share)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        share.waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # admitted, then cancelled before it could go
                self._release(share)
            elif waiter in share.waiters:
                share.waiters.remove(waiter)
            raise

    def _release(self, share: _Share) -> None:
        share.in_flight -= 1
        share.ended_at = self._clock()
        self._wake(share)

    def _share(self, table: dict[str, _Share], account: str, kind: str) -> _Share:
        share = table.get(account)
        if share is None:
            share = table[account] = _Share(account, kind)
        return share

    def call(self, account: str) -> _CallAdmission:
        """Hold one of ``account``'s model-call admissions for the call's duration (``async with``)."""
        return _CallAdmission(self, account)

    async def enter_phase(self, account: str) -> None:
        """Wait for one of ``account``'s phase admissions (give it back with ``leave_phase``)."""
        await self._acquire(self._share(self._phases, account, "phases"))

    def leave_phase(self, account: str) -> None:
        self._release(self._phases[account])

    def starting(self, account: str) -> Start:
        """Hold the phase admission ``account`` was just given (``enter_phase``) as the start of the Materialize
        batch this code runs in (and the tasks it creates): its first model call through ``call``, or
        ``Start.end``, gives it back."""
        start = Start(self, account)
        _STARTING.set(start)
        return start

    def in_flight(self, account: str, kind: str = "calls") -> int:
        share = (self._calls if kind == "calls" else self._phases).get(account)
        return share.in_flight if share else 0

    def peak(self, account: str, kind: str = "calls") -> int:
        share = (self._calls if kind == "calls" else self._phases).get(account)
        return share.peak if share else 0


class _CallAdmission:
    """``FairShare.call``'s context: a class, not a generator (``asynccontextmanager``'s machinery on every model
    call was ~3 % of a busy worker's CPU)."""

    __slots__ = ("_account", "_fair", "_share")

    def __init__(self, fair: FairShare, account: str) -> None:
        self._fair = fair
        self._account = account
        self._share: _Share | None = None

    async def __aenter__(self) -> None:
        start = _STARTING.get()
        if start is not None and start.account == self._account:  # the batch's first call: its start is over
            start.end()
        share = self._fair._share(self._fair._calls, self._account, "calls")
        await self._fair._acquire(share)
        self._share = share

    async def __aexit__(self, *exc: object) -> None:
        if self._share is not None:
            share, self._share = self._share, None
            self._fair._release(share)


class GatedSut:
    """A batch's ``SutClient`` whose calls also pass the account's share of the worker (``FairShare.call``).

    The batch's own bound (``concurrency``) is taken first, then the account's: a call waiting for its batch's slot
    holds none of the account's, so the account's admissions all go to calls that can be sent.
    """

    def __init__(self, inner: SutClient, *, share: FairShare, account: str, concurrency: int) -> None:
        self._inner = inner
        self._share = share
        self._account = account
        self._batch = asyncio.Semaphore(max(1, concurrency))

    async def complete(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> SutReply:
        async with self._batch, self._share.call(self._account):
            return await self._inner.complete(messages, params)

    async def warm(self, calls: int) -> None:
        await self._inner.warm(min(calls, self._share.call_limit(self._account)))

    async def aclose(self) -> None:
        await self._inner.aclose()


_RUNS = table_of(Run)
_RUNNING = select(_RUNS.c.account_id).distinct().where(RUNNING)


def running_accounts(engine: Engine) -> set[str]:
    """The accounts with runs running (``FairShare.watch``, ten times a second): read through the partial index
    ``ix_runs_running_account``, whose condition the query names as a literal (a bound parameter would leave a
    prepared statement's generic plan unable to use it). A Core statement built once: through an ORM session this
    poll was ~4 % of a busy worker's CPU."""
    with reader(engine).connect() as conn:
        return set(conn.execute(_RUNNING).scalars())
