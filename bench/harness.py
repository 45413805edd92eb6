"""Bench: a harness-bridge run's wall time against the same harness run directly (issue 16).

    python3 dev.py bench harness [--rows 200] [--latency-ms 20]

Starts the stack as a user would (``benchwright up`` + ``benchwright dev-model``), installs the harness runtimes
(cached under ~/.cache/benchwright-harness), then for inspect and lm-eval: one bridge run of the 200-row QA task
(launch to terminal, through the API), and the same task run directly on the host against the same dev model.
The difference is what Benchwright adds: Setup and Attach, a sandbox, the relay and the egress proxy on every call,
and the event log.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchstack import running_stack

from benchwright.client import Client
from tests.harness.qa import (
    harness_config,
    qa_jsonl,
    run_inspect_directly,
    run_lmeval_directly,
    runtimes,
)


def bridge_run(client: Client, harness: str, model_url: str) -> tuple[float, dict]:
    started = time.monotonic()
    run = client.launch(model={"identifier": "openai/dev", "api_base": model_url}, harness=harness,
                        harness_config=harness_config(harness))
    while not (run := client.run(run["id"], wait_s=5)).get("terminal"):
        pass
    return time.monotonic() - started, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bw-bench-harness-") as tmp:
        work = Path(tmp)
        (work / "qa.jsonl").write_text(qa_jsonl())
        took = runtimes(work / "data")
        print(f"harness installs (s; 0 = cached): {took}")
        with running_stack(work, answers=work / "qa.jsonl", latency_ms=args.latency_ms) as stack:
            client = Client(stack.dev["api_url"], stack.dev["api_key"], timeout=120)
            print(f"{'harness':8} {'bridge s':>9} {'direct s':>9} {'bridge pass rate':>17} {'direct accuracy':>16}")
            for harness, direct in (("inspect", run_inspect_directly), ("lmeval", run_lmeval_directly)):
                bridge_s, run = bridge_run(client, harness, stack.model_url)
                started = time.monotonic()
                accuracy, _ = direct(work / f"direct-{harness}", stack.model_url)
                direct_s = time.monotonic() - started
                print(f"{harness:8} {bridge_s:9.1f} {direct_s:9.1f} {run['tasks']['summary']['pass_rate']:17.3f} "
                      f"{accuracy:16.3f}", flush=True)


if __name__ == "__main__":
    main()
