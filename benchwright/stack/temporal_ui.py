"""What a person sees of a run in the Temporal UI: custom search attributes, summaries and details."""

from __future__ import annotations

from collections.abc import Mapping

from temporalio.common import SearchAttributeKey, SearchAttributePair

RUN_PHASE = SearchAttributeKey.for_keyword("BenchwrightPhase")
RUN_STATUS = SearchAttributeKey.for_keyword("BenchwrightStatus")
RUN_MODEL = SearchAttributeKey.for_keyword("BenchwrightModel")
RUN_ACCOUNT = SearchAttributeKey.for_keyword("BenchwrightAccount")
REGRESSION = SearchAttributeKey.for_keyword("BenchwrightRegression")
"""A scheduled replay's outcome on its RegressionWorkflow: ok, detected, ongoing, replay_failed, incomparable."""
RUN_PARENT = SearchAttributeKey.for_keyword("BenchwrightParentRun")
"""A fork's parent run id (§10; ``ParentRunId`` is a reserved Temporal name): list a run's forks with
``BenchwrightParentRun = '<run id>'``."""
OPERATOR_SESSION = SearchAttributeKey.for_keyword("BenchwrightOperatorSession")
"""The Operator session (issue 26) on its own workflow and on every run it launched: list a session and its runs
with ``BenchwrightOperatorSession = '<session id>'``."""
SEARCH_ATTRIBUTES = (RUN_PHASE, RUN_STATUS, RUN_MODEL, RUN_ACCOUNT, REGRESSION, RUN_PARENT, OPERATOR_SESSION)


def session_attributes(memo: Mapping[str, str] | None) -> list[SearchAttributePair[str]]:
    """``BenchwrightOperatorSession`` for a run the Operator starts: every start path that takes the Operator's
    ``memo`` (``{"operator_session": <session id>}``) adds these to the run's search attributes."""
    session_id = (memo or {}).get("operator_session")
    return [SearchAttributePair(OPERATOR_SESSION, session_id)] if session_id else []


FAIRNESS_ARGS = ("--dynamic-config-value", "matching.enableFairness=true",
                 "--dynamic-config-value", "matching.numTaskqueueReadPartitions=1",
                 "--dynamic-config-value", "matching.numTaskqueueWritePartitions=1")
"""Task-queue fairness (``benchwright.security.quotas``): tasks are handed out in turn across the runs' fairness keys
(their accounts), not first-in-first-out. One partition: a one-machine dev server gains nothing from four, and fairness
is kept per partition."""


DISPATCH_ARGS = ("--dynamic-config-value", "history.transferProcessorMaxPollRPS=2000",
                 "--dynamic-config-value", "history.transferProcessorMaxPollHostRPS=2000")
"""How often the history service may read its transfer queue, the queue through which every workflow task and
activity task reaches matching: Temporal's default is 20 reads a second per shard, and a dev server has one shard.
Past a burst of ~25 hops a run's every hop then waited ~40 ms for its read (``bench/temporal_dispatch.py``: 2-5 ms a
hop after a pause, ~40 ms back to back; with this, 2-8 ms throughout). A production Temporal with few shards needs
the same (``history.transferProcessorMaxPollRPS``); docs/performance.md, "Temporal's dispatch"."""


def dev_server_args() -> list[str]:
    """``temporal server start-dev`` flags that register our search attributes, turn on task-queue fairness and
    let the transfer queue keep up with a run's hops."""
    args: list[str] = []
    for key in SEARCH_ATTRIBUTES:
        args += ["--search-attribute", f"{key.name}=Keyword"]
    return [*args, *FAIRNESS_ARGS, *DISPATCH_ARGS]


def workflow_summary(*, model: str, dataset: str | None) -> str:
    return f"{model} on {dataset}"[:400]
