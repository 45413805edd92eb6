"""Runs a lighteval task inside the work sandbox, with the harness's own venv (never imported by the worker). Same
line protocol as ``inspect_bridge.py`` (``dataset``, ``sample``, ``done``).

The model is lighteval's LiteLLM backend (``openai/<model>`` at the bridge's relay: ``base_url``, the relay's key as
``api_key``, ``max_model_length`` given so it never asks openrouter.ai for a context length), one request at a time
(``concurrent_requests=1``); its prediction caches live in the sandbox's working directory. The pipeline is
lighteval's own (``Pipeline`` with the task's docs as ``get_docs`` drew them: shuffled with its seed 42, cut to
``max_samples``); its model calls and metrics run chunk by chunk over those docs (``_run_model``/``_compute_metrics``
on a slice of its ``sampling_docs``), so samples stream and a resumed batch runs only the docs not yet recorded.
A doc's few-shot examples are drawn when the docs are built, so
chunking does not change them. At the end lighteval aggregates and saves its results and details (the native log
is its results JSON). A doc's index is its position in the task's evaluation split (lighteval's ``doc.id``); its
score is its first metric (or ``metric``), clamped to [0, 1].
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


from lighteval.logging.evaluation_tracker import EvaluationTracker
from lighteval.models.endpoints.litellm_model import LiteLLMModelConfig
from lighteval.pipeline import ParallelismManager, Pipeline, PipelineParameters

tracker = EvaluationTracker(output_dir=CONFIG["output_dir"], save_details=True)
params = PipelineParameters(launcher_type=ParallelismManager.NONE, custom_tasks_directory=CONFIG.get("custom_tasks"),
                            max_samples=CONFIG.get("limit"))
model_config = LiteLLMModelConfig(model_name=f"openai/{CONFIG['model']}", base_url=CONFIG["base_url"],
                                  api_key=CONFIG["api_key"], max_model_length=CONFIG.get("max_model_length") or 8192,
                                  concurrent_requests=1, cache_dir=CONFIG["cache_dir"])
pipeline = Pipeline(tasks=CONFIG["task"], pipeline_parameters=params, evaluation_tracker=tracker,
                    model_config=model_config)
if len(pipeline.documents_dict) != 1:
    raise SystemExit(f"{CONFIG['task']!r} names {len(pipeline.documents_dict)} lighteval tasks; a bridge run runs one")
task_name, docs = next(iter(pipeline.documents_dict.items()))
emit(kind="dataset", count=len(docs), name=task_name)
done = {str(i) for i in CONFIG.get("done") or []}
todo = [d for d in docs if d.id not in done]
chunk = CONFIG.get("chunk") or 20
everything = pipeline.sampling_docs
metric_name = CONFIG.get("metric")
details = tracker.details_logger.details[task_name]
for start in range(0, len(todo), chunk):
    part = {id(d) for d in todo[start:start + chunk]}
    pipeline.sampling_docs = {method: [d for d in listed if id(d) in part] for method, listed in everything.items()}
    seen = len(details)
    outputs = pipeline._run_model()
    pipeline._post_process_outputs(outputs)
    pipeline._compute_metrics(outputs)
    for detail in details[seen:]:
        doc, response, metrics = detail.doc, detail.model_response, detail.metric
        metric = metric_name or next(iter(metrics), None)
        value = metrics.get(metric) if metric else None
        score = None if value is None else min(1.0, max(0.0, float(value)))
        texts = getattr(response, "final_text", None) or getattr(response, "text", None) or []
        emit(kind="sample", index=int(doc.id), id=doc.id, epoch=1, score=score, value=value, input=doc.query,
             output=texts[0] if texts else None, target=doc.get_golds(), usage={},
             metadata={"metric": metric, "metrics": metrics, "choices": doc.choices},
             error=None if metric is not None else "lighteval computed no metric for this doc")
pipeline.sampling_docs = everything
pipeline.evaluation_tracker.general_config_logger.log_end_time()
tracker.metrics_logger.aggregate(task_dict=pipeline.tasks_dict, bootstrap_iters=0)
tracker.details_logger.aggregate()
pipeline.save_and_push_results()
results = pipeline.get_results()
found = [os.path.join(root, f) for root, _, files in os.walk(CONFIG["output_dir"]) for f in files
         if f.startswith("results_") and f.endswith(".json")]
emit(kind="done", log=found[0] if found else None, status="success",
     metrics=(results.get("results") or {}).get(task_name, {}))
