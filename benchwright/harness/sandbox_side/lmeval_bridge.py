"""Runs an lm-evaluation-harness task inside the work sandbox, with the harness's own venv (never imported by the
worker). Same line protocol as ``inspect_bridge.py`` (``dataset``, ``sample``, ``done``).

The model is ``local-chat-completions`` at the bridge's relay (``base_url=.../chat/completions``,
``tokenized_requests=False``, ``apply_chat_template``; the key in ``OPENAI_API_KEY``), one request at a time:
lm-eval's concurrent path (aiohttp) ignores ``HTTP_PROXY``, and the egress proxy is the sandbox's only way out.

lm-eval scores a doc only after generating for every doc of its call, so docs are evaluated in chunks (its own
``samples=`` selection) and each chunk's samples are reported when it is scored: progress streams, and a resumed
batch evaluates only the docs not yet recorded. Few-shot contexts are drawn from one random sequence over the docs
of a call, so a task with ``num_fewshot > 0`` is evaluated in one call (results land at its end) to draw exactly
the shots a direct run draws. A doc's score is its first metric (or ``metric`` from the config), clamped to
[0, 1]; lm-eval reduces a task's ``repeats`` with its filter before scoring, so each doc is one trial.
"""

from __future__ import annotations

import json
import os
from typing import Any

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bw_bridge.json")) as _config:
    CONFIG = json.load(_config)
_OUT = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)


def emit(**line: Any) -> None:
    _OUT.write(json.dumps(line, default=str) + "\n")
    _OUT.flush()


def _first_text(value: Any) -> str | None:
    """The prompt lm-eval logged (its ``arguments`` nest the context string in lists)."""
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value if isinstance(value, str) else None


from lm_eval import simple_evaluate
from lm_eval.tasks import TaskManager, get_task_dict

include = CONFIG.get("include_path")
manager = TaskManager(include_path=include, include_defaults=include is None)
name = CONFIG["task"]
task = get_task_dict([name], manager)[name]
if isinstance(task, dict):
    raise SystemExit(f"{name!r} is a group of lm-eval tasks; a bridge run runs exactly one task")
docs = len(task.eval_docs)
limit = CONFIG.get("limit")
count = min(docs, limit) if limit else docs
emit(kind="dataset", count=count, name=name)
fewshot = CONFIG.get("num_fewshot")
fewshot = fewshot if fewshot is not None else (task.config.num_fewshot or 0)
done = set(CONFIG.get("done") or [])
todo = [i for i in range(count) if i not in done]
chunk = CONFIG.get("chunk") or 20
chunks = [todo[i:i + chunk] for i in range(0, len(todo), chunk)] if fewshot == 0 else [todo]
model_args = {"model": CONFIG["model"], "base_url": CONFIG["base_url"], "tokenized_requests": False,
              "num_concurrent": 1, "max_retries": 3, "timeout": CONFIG.get("timeout") or 300}
metric_name = CONFIG.get("metric")
log_path = CONFIG["log_path"]
results: dict[str, Any] = {}
for part in chunks:
    if not part:
        continue
    out = simple_evaluate(model="local-chat-completions", model_args=model_args, tasks=[name],
                          task_manager=manager, samples={name: part}, apply_chat_template=True, log_samples=True,
                          num_fewshot=CONFIG.get("num_fewshot"), gen_kwargs=CONFIG.get("gen_kwargs") or None)
    results = out["results"].get(name, {})
    with open(log_path, "a") as log:
        for s in out["samples"][name]:
            log.write(json.dumps(s, default=str) + "\n")
            metric = metric_name or s["metrics"][0]
            value = s.get(metric)
            score = None if value is None else min(1.0, max(0.0, float(value)))
            emit(kind="sample", index=s["doc_id"], id=s["doc_id"], epoch=1, score=score, value=value,
                 input=_first_text(s.get("arguments")),
                 output=(s["filtered_resps"][0] if s.get("filtered_resps") else None), target=s.get("target"),
                 metadata={"doc": s.get("doc"), "metric": metric, "filter": s.get("filter"),
                           "resps": s.get("resps")}, usage={}, error=None)
emit(kind="done", log=log_path, status="success", metrics=results)
