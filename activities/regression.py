"""Scheduled regression runs: adapters over ``benchwright.comparison.regression`` and ``benchwright.comparison.webhook``
(issue 17)."""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.common import Deps, in_thread
from benchwright.comparison.regression import (
    CheckInput,
    CheckResult,
    PreparedReplay,
    PrepareInput,
    check_replay,
    start_replay,
)
from benchwright.comparison.webhook import post_webhook
from benchwright.errors import BenchwrightError
from benchwright.events import RegressionDetected
from benchwright.proxy.addresses import parse_endpoints
from benchwright.store.policy import get_policy, record_blocked


class AlertInput(CheckInput):
    event: RegressionDetected


class RegressionActivities:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps

    @activity.defn(name="start_replay")
    async def start_replay(self, inp: PrepareInput) -> PreparedReplay:
        try:
            return await in_thread(start_replay, self.deps.settings, self.deps.engine, inp)
        except BenchwrightError as exc:  # the firing's recorded reason: the refusal's words and code
            raise ApplicationError(f"{exc.message} ({exc.code})", type=type(exc).__name__,
                                   non_retryable=True) from exc

    @activity.defn(name="check_replay")
    async def check_replay(self, inp: CheckInput) -> CheckResult:
        return await in_thread(check_replay, self.deps.engine, inp)

    @activity.defn(name="post_alert")
    async def post_alert(self, inp: AlertInput) -> int:
        """POST the alert to the schedule's webhook; a refusal is permanent, a network fault or error status is
        retried by the workflow's policy."""
        reg = inp.regression
        assert reg.webhook is not None
        policy = await in_thread(get_policy, self.deps.engine, account_id=reg.account_id)
        payload = {"type": RegressionDetected.type_name(), "run_id": inp.run_id, **inp.event.model_dump(mode="json")}
        try:
            return await post_webhook(
                url=reg.webhook, payload=payload, policy=policy,
                internal_allowed=parse_endpoints(self.deps.settings.egress_internal_allowed),
                on_refused=lambda host: record_blocked(self.deps.engine, run_id=inp.run_id,
                                                       account_id=reg.account_id, host=host))
        except BenchwrightError as exc:
            raise ApplicationError(f"{exc.message} ({exc.code})", type=type(exc).__name__,
                                   non_retryable=True) from exc
