"""Runs an inspect_ai task inside the work sandbox, with the harness's own venv (never imported by the worker).

Reads ``bw_bridge.json`` beside it; writes one JSON line per fact to the file descriptor the bridge reads (its stdout
at start; the harness's own chatter is moved to stderr):

    {"kind": "dataset", "count": N}            samples the run will score (after the limit)
    {"kind": "sample", "index", "id", "epoch", "score", "value", "input", "output", "target", "metadata", "usage",
     "error"}                                  one per scored (sample, epoch), as inspect settles it
    {"kind": "done", "log": "<path>", "status", "metrics"}

Scores are inspect's own ``value_to_float()``: ``C`` 1, ``I`` 0, ``P`` 0.5, ``N`` 0, numbers as they are (clamped
to [0, 1]); with several scorers the first one's value is the sample's score.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bw_bridge.json")) as _config:
    CONFIG = json.load(_config)
_OUT = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)  # the harness prints to stderr from here on; fd 1's pipe carries only our lines


def emit(**line: Any) -> None:
    _OUT.write(json.dumps(line, default=str) + "\n")
    _OUT.flush()


from inspect_ai import eval as inspect_eval
from inspect_ai._eval.loader import load_tasks
from inspect_ai.hooks import Hooks, SampleEnd, hooks
from inspect_ai.scorer import value_to_float

TO_FLOAT = value_to_float()
tasks = load_tasks([CONFIG["task"]], CONFIG.get("args") or {})
if len(tasks) != 1:
    raise SystemExit(f"the task spec {CONFIG['task']!r} names {len(tasks)} tasks; a bridge run runs exactly one")
task = tasks[0]
samples = list(task.dataset)
limit = CONFIG.get("limit")
count = min(len(samples), limit) if limit else len(samples)
# inspect numbers id-less samples from 1
IDS = [s.id if s.id is not None else i + 1 for i, s in enumerate(samples[:count])]
INDEX = {str(sample_id): i for i, sample_id in enumerate(IDS)}
emit(kind="dataset", count=count, name=task.name)
done = set(CONFIG.get("done") or [])
todo = [IDS[i] for i in range(count) if i not in done] if done else None
if todo == []:
    emit(kind="done", log=None, status="success", metrics={})
    sys.exit(0)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps([getattr(m, "text", str(m)) for m in value]) if isinstance(value, list) else str(value)


@hooks(name="benchwright_bridge", description="reports every scored sample to Benchwright")
class Report(Hooks):
    async def on_sample_end(self, data: SampleEnd) -> None:
        s = data.sample
        score = None
        value: Any = None
        if s.scores:
            first = next(iter(s.scores.values()))
            value = first.value
            score = min(1.0, max(0.0, float(TO_FLOAT(value))))
        usage = {name: {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens}
                 for name, u in (s.model_usage or {}).items()}
        emit(kind="sample", index=INDEX.get(str(s.id)), id=s.id, epoch=s.epoch, score=score, value=value,
             input=_text(s.input), output=s.output.completion if s.output else None, target=s.target,
             metadata=s.metadata, usage=usage, error=str(s.error.message) if s.error else None)


logs = inspect_eval(task, model=CONFIG["model"], log_dir=CONFIG["log_dir"], log_format="eval", display="none",
                    limit=None if todo is not None else limit, sample_id=todo, epochs=CONFIG.get("epochs") or 1,
                    max_connections=CONFIG.get("max_connections") or 16, fail_on_error=False,
                    score_display=False, **(CONFIG.get("generate") or {}))
log = logs[0]
metrics = {}
if log.results:
    for score in log.results.scores:
        for name, metric in score.metrics.items():
            metrics[f"{score.name}/{name}"] = metric.value
emit(kind="done", log=log.location, status=log.status, metrics=metrics)
sys.exit(0 if log.status == "success" else 1)
