"""The builtin operator (issue 26): deterministic and offline. From a structured goal it plans the runs that answer
it, reads each run's metrics when it settles, and answers with the paired statistics of
``benchwright.comparison.compare`` and the sample-size planning of ``benchwright.operator.sizing``.

Every function here is pure domain: the workflow (``workflows/operator.py``) decides *when*; the activities
(``activities/operator.py``) call these and record the events.
"""

from __future__ import annotations

from pydantic import BaseModel
from sqlalchemy.engine import Engine
from sqlmodel import Session

from benchwright.comparison.compare import SIGNIFICANCE, compare_runs, readable_run
from benchwright.comparison.regression import replay_launch
from benchwright.errors import BenchwrightError, InvalidInput
from benchwright.operator.goals import (
    Answer,
    AskGoal,
    BetterGoal,
    CheapestGoal,
    Evidence,
    Goal,
    HelpsGoal,
    PairedEvidence,
    RegressedGoal,
)
from benchwright.operator.sizing import tasks_for_paired_halfwidth, tasks_for_proportion
from benchwright.runs.forks import apply_overrides
from benchwright.schemas import LaunchRequest, ModelSpec
from benchwright.settings import Settings
from benchwright.store.models import Run
from benchwright.store.runs import run_view

__all__ = ["PlannedLaunch", "answer", "extension", "pair_evidence", "plan", "read_evidence"]


class PlannedLaunch(BaseModel):
    label: str
    """How the answer names the run: ``baseline``, ``candidate``, ``model 2``, ``replay``, ``changed``."""
    launch: LaunchRequest
    reason: str


def _launch(dataset: str, model: ModelSpec, tasks: int | None = None) -> LaunchRequest:
    if tasks is None:
        return LaunchRequest(dataset=dataset, model=model)
    return LaunchRequest(dataset=dataset, model=model, constraints={"max_tasks": tasks})


def plan(settings: Settings, engine: Engine, *, account_id: str, goal: Goal) -> list[PlannedLaunch]:
    """The runs that answer ``goal``, in launch order. The reference of ``regressed``/``helps`` must be a finished
    run the account may read (``benchwright.comparison.compare.readable_run``).

    Raises:
        NotFound: the reference run is not the account's (nor unlisted/public).
        Conflict: the reference has not finished.
        InvalidInput: the change does not make a valid launch; a goal in prose (``prose_goal``).
    """
    if isinstance(goal, BetterGoal):
        return [PlannedLaunch(label="baseline", launch=_launch(goal.dataset, goal.baseline, goal.tasks),
                              reason="measure the baseline on the dataset"),
                PlannedLaunch(label="candidate", launch=_launch(goal.dataset, goal.candidate, goal.tasks),
                              reason="measure the candidate on the same tasks, for a paired comparison")]
    if isinstance(goal, AskGoal):
        raise InvalidInput("the builtin operator answers structured goals (better, cheapest, regressed, helps); a "
                           "goal in prose needs an LLM operator (\"operator\": \"<provider>://<model>\")",
                           code="prose_goal")
    if isinstance(goal, CheapestGoal):
        return [PlannedLaunch(label=f"model {i + 1}", launch=_launch(goal.dataset, model),
                              reason=f"measure {model.identifier} against the bar of {goal.min_score:.0%}")
                for i, model in enumerate(goal.models)]
    reference = readable_run(engine, run_id=goal.reference_run, account_id=account_id)
    body = replay_launch(settings, engine, reference)  # the reference's launch, its scorer bytes pinned
    if isinstance(goal, RegressedGoal):
        return [PlannedLaunch(label="replay", launch=body,
                              reason=f"replay {reference.id} with its own model and compare task by task")]
    assert isinstance(goal, HelpsGoal)
    return [PlannedLaunch(label="changed", launch=apply_overrides(body, goal.change),
                          reason=f"re-run {reference.id} with the change ({', '.join(goal.change.given())}) "
                                 "and compare task by task")]


def extension(engine: Engine, *, account_id: str, goal: BetterGoal, evidence: list[Evidence],
              runs_left: int) -> tuple[list[PlannedLaunch], str]:
    """Sample-size planning acted on: when the first ``better`` comparison (over ``goal.tasks``) is not significant,
    both models again over the tasks a ``±halfwidth`` interval needs, if the budget has the two runs. Returns the
    launches (none: nothing to extend, or no budget) and why."""
    if goal.tasks is None or len(evidence) != 2 or not all(_usable(e) for e in evidence):
        return [], "the first comparison is not complete"
    pair = pair_evidence(engine, account_id, evidence[0].run_id, evidence[1].run_id)
    if pair.significant:
        return [], f"the difference is significant at {pair.compared} tasks (p = {pair.p_value:.3g})"
    with Session(engine) as session:
        ra, rb = session.get(Run, evidence[0].run_id), session.get(Run, evidence[1].run_id)
    lost, gained = _discordant(engine, ra, rb)
    needed = tasks_for_paired_halfwidth(lost=lost, gained=gained, n=pair.compared, halfwidth=goal.halfwidth)
    why = f"the difference is not significant at {pair.compared} tasks (p = {pair.p_value:.3g}); {needed:,} tasks " \
          f"would give ±{goal.halfwidth * 100:g} points"
    if needed <= pair.compared:
        return [], why + ": no larger run is needed"
    if runs_left < 2:
        return [], why + f", but the budget has {max(runs_left, 0)} run(s) left and extending needs 2"
    reason = why + f": measure both again over {needed:,} tasks (as many as the dataset holds)"
    return [PlannedLaunch(label="baseline (extended)", launch=_launch(goal.dataset, goal.baseline, needed),
                          reason=reason),
            PlannedLaunch(label="candidate (extended)", launch=_launch(goal.dataset, goal.candidate, needed),
                          reason=reason)], reason


def read_evidence(engine: Engine, *, run_id: str, label: str) -> Evidence:
    """The metrics of a settled run: status, pass rate and interval, no-answer/error counts, halt, cost."""
    with Session(engine) as session:
        run = session.get(Run, run_id)
    assert run is not None, run_id
    view = run_view(engine, run)
    s = view.tasks.summary
    return Evidence(label=label, run_id=run_id, model=str(view.model.get("identifier", "")),
                    status=view.display_status, pass_rate=s.pass_rate, pass_rate_ci=s.pass_rate_ci,
                    scored=s.passed + s.failed, no_answer=s.no_answer, errored=s.errored,
                    halt_reason=view.halt_reason if view.halted else None, error=view.error,
                    cost=view.cost.incurred,
                    model_cost=view.cost.model)


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.1f} %"


def pair_evidence(engine: Engine, account_id: str, a: str, b: str) -> PairedEvidence:
    """The paired comparison of two runs the account may read (``benchwright.comparison.compare``)."""
    ra = readable_run(engine, run_id=a, account_id=account_id)
    rb = readable_run(engine, run_id=b, account_id=account_id)
    c = compare_runs(engine, a=ra, b=rb)
    return PairedEvidence(a=a, b=b, difference=c.difference, difference_ci=c.difference_ci, p_value=c.p_value,
                          significant=c.significant, compared=c.compared, verdict=c.verdict)


def _usable(e: Evidence) -> bool:
    return e.status == "ok" and e.pass_rate is not None


def _paired_answer(engine: Engine, *, account_id: str, goal: Goal, a: Evidence, b: Evidence,
                   words: tuple[str, str, str, str]) -> Answer:
    """Compare b against a; ``words`` = (outcome if b is better, if worse, the sentence's subject, the change)."""
    better, worse, subject, what = words
    evidence = [a, b]
    try:
        pair = pair_evidence(engine, account_id, a.run_id, b.run_id)
    except BenchwrightError as exc:
        return Answer(outcome="failed", sentence=f"The runs could not be compared: {exc.message}",
                      evidence=evidence, unestablished=[exc.message])
    with Session(engine) as session:
        ra, rb = session.get(Run, a.run_id), session.get(Run, b.run_id)
    lost, gained = _discordant(engine, ra, rb)
    halfwidth = goal.halfwidth
    needed = tasks_for_paired_halfwidth(lost=lost, gained=gained, n=pair.compared, halfwidth=halfwidth)
    diff = f"{pair.difference * 100:+.1f} points (95 % CI {pair.difference_ci[0] * 100:+.1f} to " \
           f"{pair.difference_ci[1] * 100:+.1f}, paired p = {pair.p_value:.3g})"
    if pair.significant and pair.difference > 0:
        return Answer(outcome=better, sentence=f"Yes: {subject} {what} by {diff} over {pair.compared} tasks.",
                      evidence=evidence, comparisons=[pair])
    if pair.significant and pair.difference < 0:
        return Answer(outcome=worse, sentence=f"No: {subject} is worse by {diff} over {pair.compared} tasks.",
                      evidence=evidence, comparisons=[pair])
    gap = f"the difference is not significant at {pair.compared} tasks (p = {pair.p_value:.3g} > {SIGNIFICANCE}); " \
          f"{needed:,} tasks would be needed for ±{halfwidth * 100:g} points"
    return Answer(outcome="no_significant_difference",
                  sentence=f"No significant difference: {diff}.", evidence=evidence, comparisons=[pair],
                  unestablished=[gap], needed_tasks=needed)


def _discordant(engine: Engine, a: Run | None, b: Run | None) -> tuple[int, int]:
    if a is None or b is None:
        return 0, 0
    c = compare_runs(engine, a=a, b=b)
    return len(c.lost), len(c.gained)


def answer(engine: Engine, *, account_id: str, goal: Goal, evidence: list[Evidence],
           reference: Evidence | None = None, cut_short: str | None = None) -> Answer:
    """The answer from what the session read. ``cut_short`` says why runs the plan needed were not launched (the
    budget, a deadline, a stop, a refusal): the answer then says what it could not establish."""
    if isinstance(goal, CheapestGoal):
        return _cheapest(goal, evidence, cut_short)
    needed = 1 if isinstance(goal, (RegressedGoal, HelpsGoal)) else 2
    runs = ([reference] if reference is not None else []) + evidence
    broken = [e for e in evidence if not _usable(e)]
    if len(evidence) < needed or broken:
        why = cut_short or "; ".join(f"the {e.label} run ended {e.status}" + (f" ({e.halt_reason})" if e.halt_reason
                                                                              else "") for e in broken)
        outcome = "budget_exhausted" if cut_short and "budget" in cut_short else "failed"
        return Answer(outcome=outcome, sentence=f"The question could not be answered: {why}.", evidence=runs,
                      unestablished=[f"the comparison needs {needed + (reference is not None)} finished runs; "
                                     f"{sum(_usable(e) for e in runs)} were read"])
    if isinstance(goal, BetterGoal):
        return _paired_answer(engine, account_id=account_id, goal=goal, a=evidence[0], b=evidence[1],
                              words=("candidate_better", "candidate_worse",
                                     f"the candidate ({goal.candidate.identifier})",
                                     f"is better than the baseline ({goal.baseline.identifier})"))
    assert reference is not None
    if isinstance(goal, RegressedGoal):
        out = _paired_answer(engine, account_id=account_id, goal=goal, a=reference, b=evidence[0],
                             words=("improved", "regressed", "the model", "scores higher now"))
        if out.outcome == "regressed":
            out.sentence = "Yes, it regressed: " + out.sentence.removeprefix("No: ")
        elif out.outcome == "improved":
            out.sentence = "No regression; " + out.sentence.removeprefix("Yes: ")
        return out
    return _paired_answer(engine, account_id=account_id, goal=goal, a=reference, b=evidence[0],
                          words=("helps", "hurts", "the change", "helps"))


def _cheapest(goal: CheapestGoal, evidence: list[Evidence], cut_short: str | None) -> Answer:
    unestablished: list[str] = []
    if cut_short:
        unestablished.append(f"{len(goal.models) - len(evidence)} of {len(goal.models)} models were not measured: "
                             f"{cut_short}")
    for e in evidence:
        if not _usable(e):
            unestablished.append(f"{e.model} ({e.label}) ended {e.status}; it is not ranked")
    above = sorted((e for e in evidence if _usable(e) and (e.pass_rate or 0) >= goal.min_score),
                   key=lambda e: (e.model_cost, e.label))
    bar = f"{goal.min_score * 100:g} %"
    if not above:
        best = max((e for e in evidence if _usable(e)), key=lambda e: e.pass_rate or 0, default=None)
        tail = f"; the best was {best.model} ({best.label}) at {_pct(best.pass_rate)}" if best else ""
        outcome = "budget_exhausted" if cut_short and "budget" in cut_short else "none_meets_bar"
        return Answer(outcome=outcome, sentence=f"None of the measured models reaches {bar}{tail}.",
                      evidence=evidence, unestablished=unestablished)
    chosen = above[0]
    ci = chosen.pass_rate_ci
    if ci is not None and ci[0] < goal.min_score:
        needed = tasks_for_proportion(p=chosen.pass_rate or goal.min_score,
                                      halfwidth=max(1e-3, (chosen.pass_rate or 0) - goal.min_score) or goal.halfwidth)
        unestablished.append(f"{chosen.model}'s interval ({_pct(ci[0])}–{_pct(ci[1])}) reaches below the bar at "
                             f"{chosen.scored} tasks; about {needed:,} tasks would put it clear of {bar}")
    sentence = (f"The cheapest model at ≥ {bar} is {chosen.model} ({chosen.label}): {_pct(chosen.pass_rate)} "
                f"for ${chosen.model_cost:.4f} of model tokens")
    others = above[1:]
    if others:
        sentence += "; also above the bar but dearer: " + ", ".join(
            f"{e.model} ({e.label}, {_pct(e.pass_rate)}, ${e.model_cost:.4f})" for e in others)
    return Answer(outcome="cheapest", sentence=sentence + ".", evidence=evidence, unestablished=unestablished,
                  chosen=chosen.run_id)
