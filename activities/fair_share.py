"""The adapter between Temporal's activities and the worker's fair share
(``benchwright.security.fair_share.FairShare``).

Every activity of a run carries its account as Temporal's ``fairness_key``
(``benchwright.security.quotas.fairness_key``, inherited from the run's workflow), so the worker knows whose work each
one is without reading the store: an account is active on this worker while one of its activities runs, and the pipeline
phases and Materialize batch starts wait for their account's share (a lighter account's go first).
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from benchwright.security.fair_share import FairShare

PHASES = frozenset({"fork", "find", "fetch", "analyze", "setup", "attach", "atomize", "quick_phases", "report_run"})
"""The activities bounded by an account's phase share: the pipeline's work (sandboxes, datasets, scorer set-up; a
chain of quick phases takes one share for all of them).
Not the Materialize batches (their model calls have their own share), the run log's bookkeeping, nor the long
waits (an Operator waiting for its runs must not hold a slot its runs need)."""

STARTS = frozenset({"materialize_batch"})
"""Activities whose start is bounded like a phase (a sandbox restored, a scorer runtime started), up to their first
model call (``benchwright.security.fair_share.Start``) or ``START_BOUND_S``, whichever is first."""

START_BOUND_S = 5.0

HEARTBEAT_WHILE_WAITING_S = 1.0


class FairShareInterceptor(Interceptor):
    def __init__(self, share: FairShare) -> None:
        self.share = share

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next, self.share)


class _Inbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, share: FairShare) -> None:
        super().__init__(next)
        self.share = share

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        account = info.priority.fairness_key if info.priority is not None else None
        if info.is_local and input.args:  # Temporal gives a local activity no priority: the phase input says whose
            account = getattr(input.args[0], "fairness_key", None)
        if account is None:  # not a run's activity (or a run started without its account): not shared out
            return await self.next.execute_activity(input)
        self.share.enter(account)
        try:
            if info.activity_type in STARTS:
                await self._wait_for_phase(account, info.heartbeat_details)
                start = self.share.starting(account)
                bound = asyncio.get_running_loop().call_later(START_BOUND_S, start.end)
                try:
                    return await self.next.execute_activity(input)
                finally:
                    bound.cancel()
                    start.end()
            if info.activity_type not in PHASES:
                return await self.next.execute_activity(input)
            await self._wait_for_phase(account, info.heartbeat_details)
            try:
                return await self.next.execute_activity(input)
            finally:
                self.share.leave_phase(account)
        finally:
            self.share.leave(account)

    async def _wait_for_phase(self, account: str, details: Any) -> None:
        """Wait for the account's phase share, heartbeating the attempt's own details meanwhile (a phase with a
        heartbeat timeout is alive while it waits, and what it resumes from is kept)."""
        waiting = asyncio.ensure_future(self.share.enter_phase(account))
        try:
            while not waiting.done():
                await asyncio.wait([waiting], timeout=HEARTBEAT_WHILE_WAITING_S)
                if not waiting.done() and not activity.info().is_local:  # no heartbeats in a local activity
                    activity.heartbeat(*details)
            waiting.result()
        except BaseException:
            if waiting.done() and not waiting.cancelled() and waiting.exception() is None:
                # Admitted in the same loop turn as the wait was given up (a local phase's budget ran out, a halt
                # cancelled it): the admission is ours, and nobody else gives it back. Left taken, the account's
                # phases stayed over its share for good, and every heavier account's waited behind them.
                self.share.leave_phase(account)
            else:
                waiting.cancel()  # still waiting, or admitted but not yet resumed: FairShare gives it back
            raise
