"""The 200-row QA dataset as an inspect task file, an lm-eval task YAML and a lighteval custom task, the harness
runtimes for tests, and each harness run directly (on the host, outside Benchwright) against the same endpoint, for
comparison."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from benchwright.harness.install import install, venv_dir

CACHE = Path(os.environ.get("BENCHWRIGHT_HARNESS_CACHE", Path.home() / ".cache" / "benchwright-harness"))
"""Harness venvs are built once per machine and harness version (the test session installs what is missing)."""
ROWS = 200
LIGHTEVAL_ROWS = 60
"""lighteval imports torch, transformers and every built-in task module (~1 min here): fewer rows keep it short."""
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_COLOR": "1",
           "INSPECT_DISPLAY": "none"}

INSPECT_TASK = '''
from inspect_ai import Task, task
from inspect_ai.dataset import FieldSpec, json_dataset
from inspect_ai.scorer import match
from inspect_ai.solver import generate


@task
def qa():
    return Task(dataset=json_dataset("qa.jsonl", FieldSpec(input="question", target="answer", id="id")),
                solver=generate(), scorer=match())
'''

LMEVAL_TASK = '''
task: bw_qa
dataset_path: json
dataset_kwargs:
  data_files:
    test: qa.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: 32
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
'''


LIGHTEVAL_TASK = '''
import os

from lighteval.metrics.metrics import Metrics
from lighteval.tasks.lighteval_task import LightevalTaskConfig
from lighteval.tasks.requests import Doc


def qa_prompt(line, task_name=None):
    return Doc(task_name=task_name, query=line["question"], choices=[line["answer"]], gold_index=0)


qa = LightevalTaskConfig(name="qa", prompt_function=qa_prompt, hf_repo=os.path.dirname(os.path.abspath(__file__)),
                         hf_subset="default", evaluation_splits=["test"], few_shots_split=None,
                         few_shots_select=None, generation_size=32, stop_sequence=["\\n\\n"],
                         metrics=[Metrics.exact_match])
TASKS_TABLE = [qa]
'''
"""Reads ``test.jsonl`` beside it (the split is named by the file)."""


def qa_rows(n: int = ROWS) -> list[dict[str, str]]:
    return [{"id": f"q{i}", "question": f"What is {i} plus {i * 7 % 13}? (item {i})", "answer": str(i + i * 7 % 13)}
            for i in range(n)]


def qa_jsonl(n: int = ROWS) -> str:
    return "".join(json.dumps(r) + "\n" for r in qa_rows(n))


def answers(n: int = ROWS) -> dict[str, str]:
    return {r["question"]: r["answer"] for r in qa_rows(n)}


def harness_config(harness: str, **extra: Any) -> dict[str, Any]:
    if harness == "lighteval":
        return {"task_file": LIGHTEVAL_TASK, "task_name": "qa|0", "files": {"test.jsonl": qa_jsonl(LIGHTEVAL_ROWS)},
                **extra}
    task = INSPECT_TASK if harness == "inspect" else LMEVAL_TASK
    return {"task_file": task, "files": {"qa.jsonl": qa_jsonl()}, **extra}


def runtimes(data_dir: Path) -> dict[str, float]:
    """Install both harnesses into the cache (what is missing) and link them into the stack's harness dir; returns
    the seconds each install took (0 when cached)."""
    took = {}
    for name in ("inspect", "lmeval"):
        path, took[name] = install(CACHE, name)
        link = venv_dir(data_dir / "harness", name)
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.exists():
            link.symlink_to(path)
    return took


def run_inspect_directly(workdir: Path, base_url: str, *, limit: int | None = None) -> tuple[float, dict[str, float]]:
    """``inspect eval`` on the host against ``base_url``: (accuracy, sample id -> score)."""
    venv = venv_dir(CACHE, "inspect")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "task.py").write_text(INSPECT_TASK)
    (workdir / "qa.jsonl").write_text(qa_jsonl())
    env = {**os.environ, **OFFLINE, "BW_BASE_URL": base_url, "BW_API_KEY": "none"}
    args = [str(venv / "bin" / "inspect"), "eval", "task.py", "--model", "openai-api/bw/dev", "--log-dir", "logs",
            "--log-format", "eval", "--display", "none", *(["--limit", str(limit)] if limit else [])]
    subprocess.run(args, cwd=workdir, env=env, check=True, capture_output=True, timeout=600)
    log = next((workdir / "logs").glob("*.eval"))
    reader = ("import json, sys\nfrom inspect_ai.log import read_eval_log\n"
              "from inspect_ai.scorer import value_to_float\n"
              "log = read_eval_log(sys.argv[1]); f = value_to_float()\n"
              "print(json.dumps({'accuracy': log.results.scores[0].metrics['accuracy'].value,"
              " 'scores': {str(s.id): f(next(iter(s.scores.values())).value) for s in log.samples}}))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", reader, str(log)], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    data = json.loads(out)
    return data["accuracy"], data["scores"]


def run_lmeval_directly(workdir: Path, base_url: str, *, limit: int | None = None) -> tuple[float, dict[int, float]]:
    """``lm_eval`` on the host against ``base_url``: (exact_match, doc id -> score)."""
    venv = venv_dir(CACHE, "lmeval")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "bw_qa.yaml").write_text(LMEVAL_TASK)
    (workdir / "qa.jsonl").write_text(qa_jsonl())
    env = {**os.environ, **OFFLINE, "OPENAI_API_KEY": "none", "HF_HOME": str(workdir / ".hf")}
    args = [str(venv / "bin" / "lm_eval"), "--model", "local-chat-completions", "--model_args",
            f"model=dev,base_url={base_url}/chat/completions,tokenized_requests=False,num_concurrent=1",
            "--tasks", "bw_qa", "--include_path", str(workdir), "--apply_chat_template", "--log_samples",
            "--output_path", str(workdir / "out"), *(["--limit", str(limit)] if limit else [])]
    subprocess.run(args, cwd=workdir, env=env, check=True, capture_output=True, timeout=900)
    results = json.loads(next((workdir / "out").rglob("results_*.json")).read_text())
    samples = [json.loads(line) for line in next((workdir / "out").rglob("samples_bw_qa_*.jsonl")).open()]
    return results["results"]["bw_qa"]["exact_match,none"], {s["doc_id"]: float(s["exact_match"]) for s in samples}


def lighteval_runtime(data_dir: Path) -> float:
    """Install lighteval into the cache (when missing) and link it into the stack's harness dir; install seconds."""
    path, took = install(CACHE, "lighteval")
    link = venv_dir(data_dir / "harness", "lighteval")
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(path)
    return took


def run_lighteval_directly(workdir: Path, base_url: str) -> tuple[float, dict[int, float]]:
    """``lighteval endpoint litellm`` on the host against ``base_url``: (exact_match, doc id -> score)."""
    venv = venv_dir(CACHE, "lighteval")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "qa_task.py").write_text(LIGHTEVAL_TASK)
    (workdir / "test.jsonl").write_text(qa_jsonl(LIGHTEVAL_ROWS))
    env = {**os.environ, **OFFLINE, "OPENAI_API_KEY": "none", "HF_HOME": str(workdir / ".hf"),
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HOME": str(workdir)}
    args = [str(venv / "bin" / "lighteval"), "endpoint", "litellm",
            f"model_name=openai/dev,base_url={base_url},api_key=none,max_model_length=8192,concurrent_requests=1,"
            f"cache_dir={workdir / '.cache'}", "qa|0", "--custom-tasks", "qa_task.py", "--save-details",
            "--output-dir", str(workdir / "out")]
    subprocess.run(args, cwd=workdir, env=env, check=True, capture_output=True, timeout=900)
    results = json.loads(next((workdir / "out").rglob("results_*.json")).read_text())
    reader = ("import json, sys\nimport pandas\nframe = pandas.read_parquet(sys.argv[1])\n"
              "print(json.dumps({str(r['doc']['id']): float(r['metric']['em']) for _, r in frame.iterrows()}))")
    details = next((workdir / "out").rglob("details_*.parquet"))
    out = subprocess.run([str(venv / "bin" / "python"), "-c", reader, str(details)], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    return results["results"]["qa|0"]["em"], {int(k): v for k, v in json.loads(out).items()}


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    started = time.monotonic()
    return fn(*args, **kwargs), time.monotonic() - started
