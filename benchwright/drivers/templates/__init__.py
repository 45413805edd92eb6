"""The builtin driver's scorer templates, and how it picks one from what Analyze saw.

Each template is a complete, standard-library-only task_impl.py in this directory whose ``CONFIG = {...}`` line
is replaced by the dataset's column mapping when rendered (so the file under test is the file that runs). The
rules every template shares (the answer part of a reasoning model's reply) live in ``_reply.py``: a template imports
them with a line ending ``# inlined by render()``, which rendering replaces by that module's code, so the rendered
file stays standalone. Each template's ``score()`` records ``extracted`` (was an answer found), ``answer`` (it, or
None) and ``rule`` (which rule found it) in score_meta; docs/templates.md lists the rules in order.

    exact_match      exact.py       question/answer QA: normalised exact match
    numeric          numeric.py     GSM8K: '#### 1,234' references, numeric answer read from free text
    multiple_choice  choice.py      MMLU/ARC: a choices list or A-D columns, answer as index/letter/label
    tool_call        toolcall.py    BFCL: functions sent as tools, calls compared structurally
    code             code_exec.py   HumanEval/MBPP: the completion run against the tests in a child process

Selection (:func:`select_template`) tries the most specific shape first (code, tool call, multiple choice, numeric,
exact match) on the columns and a sample of rows, and raises ``DriverFailed`` naming the columns it saw when no
shape fits: it never guesses.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchwright.drivers.base import DriverFailed, ScorerPlan

_DIR = Path(__file__).resolve().parent
_CONFIG_LINE = re.compile(r"^CONFIG = \{.*\}$", re.MULTILINE)
# A template's import of a shared helper module of this directory, which render() replaces by the module's code.
_SHARED_IMPORT = re.compile(r"^from benchwright\.drivers\.templates\.(_[a-z]+) import "
                            r"(?:\(  # inlined by render\(\)\n[^)]*\)|[^\n(]*# inlined by render\(\))$", re.MULTILINE)

TEMPLATE_FILES: dict[str, str] = {
    "exact_match": "exact.py",
    "numeric": "numeric.py",
    "multiple_choice": "choice.py",
    "tool_call": "toolcall.py",
    "code": "code_exec.py",
}
"""Template name -> its file in this directory."""

FIELD_PAIRS: tuple[tuple[str, str], ...] = (
    ("question", "answer"),
    ("input", "target"),
    ("prompt", "completion"),
    ("problem", "solution"),
    ("input", "output"),
    ("query", "response"),
    ("question", "target"),
    ("problem", "answer"),
)
"""Common (input, reference) column names, most specific first; matched case-insensitively."""

_INPUTS = ("question", "prompt", "input", "query", "problem", "text", "instruction")
_ANSWERS = ("answer", "answerkey", "answer_key", "label", "target", "correct", "gold", "reference")
_CHOICES = ("choices", "options", "candidates")
_FUNCTIONS = ("functions", "function", "tools")
_CALLS = ("ground_truth", "expected", "expected_call", "expected_calls", "answer", "target", "calls")
_NUMBER = re.compile(r"^\s*[-\u2212]?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?\s*%?\s*$")


def render(template: str, config: dict[str, Any]) -> str:
    """The source of task_impl.py: the template's file with ``CONFIG`` set to ``config``.

    Raises:
        KeyError: an unknown template name.
    """
    source = _SHARED_IMPORT.sub(lambda m: _shared_code(m.group(1)),
                                (_DIR / TEMPLATE_FILES[template]).read_text(encoding="utf-8"))
    literal = "CONFIG = " + repr(config)
    rendered, count = _CONFIG_LINE.subn(lambda _m: literal, source, count=1)
    if count != 1:
        raise RuntimeError(f"template {TEMPLATE_FILES[template]} has no one-line 'CONFIG = {{...}}' to render")
    return rendered


def prime_source() -> str:
    """Python a warm scorer runtime runs while it waits (``benchwright.sandbox.local.warm``): every builtin
    template's module-level imports and assignments (its regular expressions among them), each on its own and its
    error ignored, without the functions and classes. A task_impl.py rendered from a template then loads with its
    imports done and its patterns in ``re``'s cache: the numeric one in ~1.5 ms instead of 15-18 ms in a fresh
    interpreter, for ~27 ms of the waiting runtime's own time. It leaves nothing the scorer sees but those caches."""
    statements: list[ast.stmt] = []
    for name in sorted(TEMPLATE_FILES):
        for node in ast.parse(render(name, {})).body:
            future = isinstance(node, ast.ImportFrom) and node.module == "__future__"  # only first in a file
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign)) and not future:
                statements.append(ast.Try(body=[node], handlers=[ast.ExceptHandler(
                    type=ast.Name("Exception", ast.Load()), name=None, body=[ast.Pass()])], orelse=[], finalbody=[]))
    return ast.unparse(ast.fix_missing_locations(ast.Module(body=statements, type_ignores=[]))) + "\n"


def _shared_code(module: str) -> str:
    """A shared helper module's code, from its first import on (its docstring stays in this directory)."""
    source = (_DIR / f"{module}.py").read_text(encoding="utf-8")
    start = re.search(r"^import ", source, re.MULTILINE)
    if start is None:
        raise RuntimeError(f"shared template module {module}.py has no import line to start from")
    code = source[start.start():].rstrip()
    return (f"# --- inlined from benchwright/drivers/templates/{module}.py by render() ---\n{code}\n"
            f"# --- end of {module}.py ---")


def impl_sha256(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def _col(columns: list[str], names: tuple[str, ...]) -> str | None:
    by_lower = {c.lower(): c for c in columns}
    return next((by_lower[n] for n in names if n in by_lower), None)


def _loads(value: Any) -> Any:
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _code(columns: list[str], rows: list[dict[str, Any]]) -> ScorerPlan | None:
    test, entry, prompt = _col(columns, ("test",)), _col(columns, ("entry_point",)), _col(columns, ("prompt",))
    if test and entry and prompt:
        return ScorerPlan(template="code", fields={"input": prompt, "test": test, "entry_point": entry},
                          why=f"'{prompt}', '{test}' and '{entry}' columns are HumanEval's shape: the completion is "
                              "run against the tests")
    tests, text = _col(columns, ("test_list",)), _col(columns, ("text", "prompt", "question"))
    if tests and text:
        setup = _col(columns, ("test_setup_code",))
        return ScorerPlan(template="code", fields={"input": text, "test": tests, **({"setup": setup} if setup else {})},
                          why=f"'{text}' and '{tests}' (assert lines) are MBPP's shape: the code is run against the "
                              "asserts")
    return None


def _tool_call(columns: list[str], rows: list[dict[str, Any]]) -> ScorerPlan | None:
    functions, question = _col(columns, _FUNCTIONS), _col(columns, _INPUTS)
    calls = _col([c for c in columns if c != functions], _CALLS)
    if not (functions and question and calls):
        return None
    for row in rows:
        fns = _loads(row.get(functions))
        fns = [fns] if isinstance(fns, dict) else fns
        if not isinstance(fns, list) or not all(isinstance(f, dict) and "name" in f.get("function", f) for f in fns):
            return None
    return ScorerPlan(template="tool_call", fields={"input": question, "functions": functions, "reference": calls},
                      why=f"'{functions}' holds function schemas and '{calls}' the expected call: the functions are "
                          "sent as tools and the model's calls compared structurally")


def _choice(columns: list[str], rows: list[dict[str, Any]]) -> ScorerPlan | None:
    question, answer = _col(columns, _INPUTS), _col(columns, _ANSWERS)
    if not (question and answer):
        return None
    choices = _col(columns, _CHOICES)
    if choices and all(isinstance(_loads(r.get(choices)), (list, dict)) for r in rows):
        return ScorerPlan(template="multiple_choice",
                          fields={"input": question, "reference": answer, "choices": choices},
                          why=f"'{choices}' holds the options and '{answer}' the correct one: the prompt lists "
                              "lettered choices and the letter is read from the reply")
    letters = []
    by_lower = {c.lower(): c for c in columns}
    for letter in "abcdefgh":
        if letter not in by_lower:
            break
        letters.append(by_lower[letter])
    if len(letters) >= 2:
        return ScorerPlan(template="multiple_choice",
                          fields={"input": question, "reference": answer, "letters": ",".join(letters)},
                          why=f"columns {', '.join(letters)} hold the options and '{answer}' the correct one: the "
                              "prompt lists lettered choices and the letter is read from the reply")
    return None


def _qa_pair(columns: list[str]) -> tuple[str, str] | None:
    by_lower = {c.lower(): c for c in columns}
    for inp, ref in FIELD_PAIRS:
        if inp in by_lower and ref in by_lower:
            return by_lower[inp], by_lower[ref]
    return None


def _numeric(columns: list[str], rows: list[dict[str, Any]]) -> ScorerPlan | None:
    pair = _qa_pair(columns)
    if pair is None or not rows:
        return None
    refs = [str(r.get(pair[1], "")) for r in rows]
    hashes = all("####" in ref and _NUMBER.match(ref.rsplit("####", 1)[1]) for ref in refs)
    plain = all(_NUMBER.match(ref) for ref in refs)
    if not (hashes or plain):
        return None
    how = "end in '#### <number>'" if hashes else "are numbers"
    return ScorerPlan(template="numeric", fields={"input": pair[0], "reference": pair[1]},
                      why=f"every sampled '{pair[1]}' {how}: the final number is read from the reply and compared "
                          "numerically")


def _exact(columns: list[str], rows: list[dict[str, Any]]) -> ScorerPlan | None:
    pair = _qa_pair(columns)
    if pair is None:
        return None
    return ScorerPlan(template="exact_match", fields={"input": pair[0], "reference": pair[1]},
                      why=f"'{pair[0]}' and '{pair[1]}' are a question/answer pair with free-text answers: "
                          "normalised exact match")


_DETECTORS: tuple[Callable[[list[str], list[dict[str, Any]]], ScorerPlan | None], ...] = (
    _code, _tool_call, _choice, _numeric, _exact)


def select_template(*, columns: list[str], rows: list[dict[str, Any]]) -> ScorerPlan:
    """The template that fits the dataset, most specific shape first.

    Raises:
        DriverFailed: no template fits; the message names the columns seen and the shapes known.
    """
    for detect in _DETECTORS:
        plan = detect(columns, rows)
        if plan is not None:
            return plan
    raise DriverFailed(
        f"no scorer template fits the columns {columns}: the builtin driver knows question/answer pairs "
        f"({', '.join(f'{i}/{r}' for i, r in FIELD_PAIRS)}), numeric answers, multiple choice (a choices column or "
        "A-D columns with an answer), tool calls (functions + ground_truth) and code (prompt/test/entry_point or "
        "text/test_list); rename the columns, or launch with your own task_impl", code="no_template")


def render_plan(plan: ScorerPlan, *, code_timeout_s: float = 5.0) -> str:
    """task_impl.py for ``plan``."""
    fields = dict(plan.fields)
    if plan.template == "multiple_choice":
        letters = fields.pop("letters", "")
        config: dict[str, Any] = {"choices": None, **fields, "letters": letters.split(",") if letters else []}
    elif plan.template == "code":
        style = "humaneval" if "entry_point" in fields else "mbpp"
        config = {"style": style, "entry_point": "entry_point", "setup": "test_setup_code", **fields,
                  "timeout_s": code_timeout_s}
    else:
        config = fields
    return render(plan.template, config)
