"""The activity interceptor (``activities.fair_share``) under Temporal's own ``ActivityEnvironment``: a Materialize
batch of a heavier account waits for a lighter account's phase, runs holding its account's phase admission as its
start, and gives it back at its first model call. The account comes from the activity's fairness key. No sleeps,
no timings: a fake clock, ``observe_lag`` to re-check the bounds."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from temporalio.common import Priority
from temporalio.testing import ActivityEnvironment
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput

from activities.fair_share import FairShareInterceptor
from benchwright.security.fair_share import FairShare
from tests.domain.test_fair_share_domain import Clock, settle


class _Call(ActivityInboundInterceptor):
    """The end of the chain: calls the activity function itself (what Temporal's worker does)."""

    def __init__(self) -> None:
        pass

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        return await input.fn(*input.args)


async def test_a_heavier_accounts_batch_waits_for_the_lighter_ones_phase_and_its_start_ends_at_its_first_call(
        ) -> None:
    clock = Clock()
    share = FairShare(phase_slots=2, yield_s=1.0, clock=clock)
    for _ in range(20):  # A has used the worker: heavier than B
        async with share.call("a"):
            pass
    share.enter("b")
    await share.enter_phase("b")  # B's phase under way
    seen: dict[str, int] = {}

    async def batch() -> str:
        seen["phases at start"] = share.in_flight("a", "phases")
        async with share.call("a"):
            seen["phases at first call"] = share.in_flight("a", "phases")
        return "done"

    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, activity_type="materialize_batch",
                                   priority=Priority(fairness_key="a"))
    inbound = FairShareInterceptor(share).intercept_activity(_Call())
    run = asyncio.ensure_future(env.run(
        inbound.execute_activity, ExecuteActivityInput(fn=batch, args=[], executor=None, headers={})))
    await settle()
    assert not seen and share.yields("a")  # A's batch waits while B's phase runs
    share.leave_phase("b")
    clock.now += 1.1
    share.observe_lag(0.0)
    assert await run == "done"
    assert seen == {"phases at start": 1, "phases at first call": 0}
    assert share.in_flight("a", "phases") == 0 and share.in_flight("a") == 0


async def test_a_local_phase_is_counted_for_the_account_its_input_names() -> None:
    """Temporal gives a local activity (a quick phase run in its workflow task) no priority: the account comes from
    ``PhaseInput.fairness_key``, and the phase holds that account's phase admission while it runs."""
    from benchwright.runs.pipeline import PhaseInput
    from benchwright.schemas import LaunchRequest

    share = FairShare(phase_slots=2, yield_s=1.0, clock=Clock())
    seen: dict[str, int] = {}

    async def atomize(inp: PhaseInput) -> str:
        seen["b"], seen["a"] = share.in_flight("b", "phases"), share.in_flight("a", "phases")
        return inp.phase

    inp = PhaseInput(run_id="r", phase="atomize", invocation=1, driver="builtin", fairness_key="b",
                     launch=LaunchRequest(dataset="d.jsonl", model={"identifier": "openai/dev"}))
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, activity_type="atomize", is_local=True, priority=Priority())
    inbound = FairShareInterceptor(share).intercept_activity(_Call())
    assert await env.run(inbound.execute_activity,
                         ExecuteActivityInput(fn=atomize, args=[inp], executor=None, headers={})) == "atomize"
    assert seen == {"b": 1, "a": 0}
    assert share.in_flight("b", "phases") == 0 and share.in_flight("b") == 0


async def test_a_wait_given_up_in_the_turn_it_is_admitted_gives_the_admission_back() -> None:
    """A phase waiting for its account's share is cancelled (its local budget ran out, or a halt) in the very loop
    turn its admission arrives: the admission must be given back, or the account holds a phase slot for good."""
    share = FairShare(phase_slots=2, alone_phase_slots=1, yield_s=1.0, clock=Clock())
    share.enter("a")
    await share.enter_phase("a")  # the only slot taken
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, activity_type="analyze", priority=Priority(fairness_key="a"))

    async def phase() -> str:
        return "ran"

    inbound = FairShareInterceptor(share).intercept_activity(_Call())
    run = asyncio.ensure_future(env.run(
        inbound.execute_activity, ExecuteActivityInput(fn=phase, args=[], executor=None, headers={})))
    await settle()
    waiting = [t for t in asyncio.all_tasks() if "enter_phase" in repr(t.get_coro())]
    assert len(waiting) == 1 and not run.done()
    # Cancel the activity from the admission's own completion: the interceptor resumes with both at once
    waiting[0].add_done_callback(lambda _: run.cancel())
    share.leave_phase("a")  # the first phase ends: the waiter is admitted
    try:
        await run
    except asyncio.CancelledError:
        pass
    assert share.in_flight("a", "phases") == 0, "the admission of the cancelled wait was kept"
