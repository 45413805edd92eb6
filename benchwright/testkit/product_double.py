"""A scripted agent for the bundled ``terminal-basics`` recipe, served by the dev-model double
(``DevModelConfig.agent_scripts``): it solves a known subset of the tasks, so the demo and the tests know the exact
pass rate a product-sandbox run of the recipe must reach.

Of the 22 tasks: 16 solved (each a shell command or a file write, then ``finish``), 3 answered wrongly (fail),
1 given up with a plain reply (fail), 1 never scripted (the double answers "I don't know.": fail), and 1 runaway
agent that runs ``true`` until its turn limit (err).
"""

from __future__ import annotations

from typing import Any

from benchwright.product.recipe import Recipe, bundled_path, load
from benchwright.testkit.devmodel import DevModelConfig

RECIPE = "terminal-basics"


def _shell(command: str) -> list[list[dict[str, Any]]]:
    return [[{"name": "shell", "arguments": {"command": command}}],
            [{"name": "finish", "arguments": {"summary": "done"}}]]


def _write(path: str, content: str) -> list[list[dict[str, Any]]]:
    return [[{"name": "write_file", "arguments": {"path": path, "content": content}}],
            [{"name": "finish", "arguments": {"summary": f"wrote {path}"}}]]


SOLVED: dict[str, list[list[dict[str, Any]]]] = {
    "hello-file": _write("hello.txt", "hello world\n"),
    "count-lines": _shell("wc -l < data/words.txt > count.txt"),
    "sum-numbers": _shell("awk '{s+=$1} END {print s}' data/numbers.txt > sum.txt"),
    "make-dir": _shell("mkdir -p out/reports"),
    "copy-file": _shell("mkdir -p backup && cp notes/todo.md backup/todo.md"),
    "delete-tmp": _shell("find scratch -name '*.tmp' -delete"),
    "sort-words": _shell("sort data/words.txt > sorted.txt"),
    "grep-errors": _shell("grep ERROR logs/app.log > errors.log"),
    "csv-names": _shell("tail -n +2 data/people.csv | cut -d, -f1 > names.txt"),
    "replace-text": _shell("sed -i 's/TODO/DONE/g' notes/todo.md"),
    "make-executable": _shell("chmod +x scripts/run.sh"),
    "greet-script": _write("greet.sh", 'echo "hi $1"\n'),
    "fifth-line": _shell("sed -n 5p data/words.txt > fifth.txt"),
    "file-size": _shell("wc -c < logs/app.log > size.txt"),
    "upper-case": _shell("tr a-z A-Z < data/words.txt > upper.txt"),
    "setup-marker": [[{"name": "read_file", "arguments": {"path": ".setup-done"}}],
                     [{"name": "shell", "arguments": {"command": "cp .setup-done marker.txt"}}],
                     [{"name": "finish", "arguments": {}}]],
}
WRONG: dict[str, list[list[dict[str, Any]]]] = {
    "distinct-words": _write("distinct.txt", "10\n"),  # counts duplicates too
    "oldest-person": _write("oldest.txt", "Alan\n"),
    "reverse-lines": _shell("cat data/numbers.txt > reversed.txt"),
}
Script = list[list[dict[str, Any]]]
GIVES_UP: dict[str, Script] = {"json-config": [[]]}  # a plain reply, no tool call: done, and the checker fails
RUNAWAY: dict[str, Script] = {"many-files": [[{"name": "shell", "arguments": {"command": "true"}}]]}  # runs on
UNSCRIPTED = ("count-errors",)

EXPECTED = {"pass": len(SOLVED), "fail": len(WRONG) + len(GIVES_UP) + len(UNSCRIPTED), "err": len(RUNAWAY)}
"""What a run of the bundled recipe against :func:`config` ends with (16 / 5 / 1)."""
PASS_RATE = EXPECTED["pass"] / (EXPECTED["pass"] + EXPECTED["fail"])
"""16 / 21: the run's pass rate leaves errored tasks out of its denominator (docs/results.md)."""


def recipe() -> Recipe:
    return load(bundled_path(RECIPE))


def outcomes() -> dict[str, str]:
    """Task id -> the outcome the scripted agent gets."""
    return {**dict.fromkeys(SOLVED, "pass"), **dict.fromkeys([*WRONG, *GIVES_UP, *UNSCRIPTED], "fail"),
            **dict.fromkeys(RUNAWAY, "err")}


def config(**kwargs: Any) -> DevModelConfig:
    """The double: each task's instruction -> its script."""
    by_id = {t.id: t.instruction for t in recipe().tasks}
    scripts = {by_id[tid]: steps for tid, steps in {**SOLVED, **WRONG, **GIVES_UP, **RUNAWAY}.items()}
    return DevModelConfig(answers={}, agent_scripts=scripts, **kwargs)
