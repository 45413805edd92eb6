"""task_impl.py written by Benchwright's builtin driver: code generation, scored by running the tests
(HumanEval / MBPP style).

HumanEval rows: ``prompt`` (signature + docstring), ``test`` (defines ``check(candidate)``), ``entry_point``.
MBPP rows: ``text`` (the task), ``test_list`` (assert lines) and optional ``test_setup_code``. The completion is
taken from the reply's answer part (a reasoning block skipped) with markdown fences and prose stripped (see
``find_code``), joined to the prompt (a body) or replacing its stub (a whole function; a class-based solution's
method becomes the entry point; an ``if __name__ == "__main__":`` demo is dropped), and run with the tests in a
child Python process of the scorer (inside the sandbox, so no network) under a time limit: exit 0 is a pass; a
failed assert, an exception or running past the limit (an infinite loop) is a fail. Standard library only.
CONFIG: the column names and ``timeout_s``.
"""

import ast
import hashlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading

from benchwright.drivers.templates._reply import answer_part  # inlined by render()

CONFIG = {"style": "humaneval", "input": "prompt", "test": "test", "entry_point": "entry_point", "timeout_s": 5.0}
SYSTEM_PROMPT = "You are an expert Python programmer. Reply with the complete code in one ```python block."
# A fence may be indented (a block inside a list item: "1. The code:" then "   ```python"): as in CommonMark, up to
# as much indentation as the opening fence has is taken off each line of its block.
_FENCE = re.compile(r"(?:^([ \t]+))?```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL | re.MULTILINE)
# The scorer runs many tasks on threads: at most this many candidate programs run at once, so a sweep at
# concurrency 128 does not start 128 interpreters on the sandbox's one core and time slow-but-correct ones out
# while they wait for the CPU (the limit measures the candidate's own run; waiting for a slot counts only against
# the attempt's duration). Measured on 2 cores: 64 trivial candidates took 1.05 s all at once, 1.34 s through 2
# slots (~20 ms of interpreter start each).
_SLOTS = threading.BoundedSemaphore(max(2, os.cpu_count() or 2))
_CODE_START = re.compile(r"^(?:def |async def |class |import |from |@|#|[A-Za-z_][A-Za-z0-9_]*\s*(?:\[[^\]]*\]\s*)?=|"
                         r"if |for |while |try:|with |return |    |\t)")
_MAIN_GUARD = re.compile(r"^if\s+__name__\s*==\s*['\"]__main__['\"]\s*:", re.MULTILINE)


def _compiles(code):
    """True when ``code`` compiles (stricter than parsing: 'return' outside a function fails)."""
    try:
        compile(code, "<candidate>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def _parses(code):
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def _detab(code):
    """Leading tabs as four spaces each, so a tab-indented body can continue a space-indented prompt, and leading
    no-break spaces (code copied out of a web page) as spaces."""
    return re.sub(r"^[ \t\u00a0]*[\t\u00a0][ \t\u00a0]*",
                  lambda m: m.group().replace("\t", "    ").replace("\u00a0", " "), code, flags=re.MULTILINE)


def _has_code(code):
    """True when ``code`` has a line that is neither blank nor a comment."""
    return any(line.strip() and not line.strip().startswith("#") for line in code.splitlines())


def _defines(code, entry):
    """'function' when ``code`` defines ``entry`` at its top level, 'method' when only a class of it does."""
    if not entry:
        return None
    if re.search(r"^(?:async\s+)?def\s+" + re.escape(entry) + r"\s*\(", code, re.MULTILINE):
        return "function"
    if re.search(r"^class\s", code, re.MULTILINE) and re.search(
            r"^[ \t]+(?:async\s+)?def\s+" + re.escape(entry) + r"\s*\(\s*self\b", code, re.MULTILINE):
        return "method"
    return None


def _usable(code, entry, prompt):
    """``code`` as it will run (tabs converted when that is what makes it compile), or None when it is not a
    candidate: a whole program (it defines ``entry``) must compile on its own, a body must compile after the
    prompt (HumanEval's completion format), so a body cut down to a blank line or a comment never passes."""
    if not _has_code(code):
        return None
    variants = [code, _detab(code)]
    if code[:1].isspace():
        dedented = textwrap.dedent(variants[1])
        if _defines(dedented, entry):
            variants.insert(0, dedented)  # a whole program indented as markdown's code block
    for variant in variants:
        if _defines(variant, entry) or prompt is None:
            if _compiles(variant):
                return variant
        elif _compiles(prompt + variant):
            return variant
        elif not variant[:1].isspace() and _compiles(prompt + _indent(variant)):
            return _indent(variant)  # a body the model wrote without its indentation
    return None


def _indent(code):
    return "\n".join(("    " + line) if line.strip() else line for line in code.splitlines())


def _undent(body, n):
    """``body`` with up to ``n`` leading spaces or tabs taken off each line."""
    if not n:
        return body
    return "\n".join(line[min(n, len(line) - len(line.lstrip(" \t"))):] for line in body.split("\n"))


def extract_code(reply, entry_point=None, prompt=None):
    """The code in a reply (see :func:`find_code`); the reply's text when it holds none."""
    code, _ = find_code(reply, entry_point, prompt)
    return str(reply or "") if code is None else code


def find_code(reply, entry_point=None, prompt=None):
    """(code, rule): the code in the reply's answer part (a reasoning block skipped) and the rule that found it.

    ``fence``: the last fenced block that defines ``entry_point``, else the first that continues ``prompt`` as a
    body, else the first python/untagged block (an unterminated fence runs to the reply's end). ``text``: without
    fences, the reply from its first code-looking line (a comment or an indented line counts), trimmed of trailing
    prose until it compiles, as a whole program or after the prompt. (None, None) when the reply holds no code.
    """
    text = answer_part(reply)
    blocks = [(lang.lower(), _undent(body, len(indent))) for indent, lang, body in _FENCE.findall(text)]
    if blocks:
        python = [b for lang, b in blocks if lang in ("python", "py", "python3", "")] or [b for _, b in blocks]
        python = [b.strip("\n") for b in python if b.strip()]
        for body in reversed(python):
            if _defines(body, entry_point) and _usable(body, entry_point, prompt) is not None:
                return _usable(body, entry_point, prompt), "fence"
        for body in python:
            usable = _usable(body, entry_point, prompt)
            if usable is not None:
                return usable, "fence"
        if python:
            return python[0], "fence"  # it will not run: a wrong answer, not a missing one
        return None, None
    lines = text.splitlines()[:2000]
    starts = [i for i, line in enumerate(lines) if _CODE_START.match(line)][:30]
    for start in starts:
        code_lines = lines[start:]
        while code_lines:
            usable = _usable("\n".join(code_lines), entry_point, prompt)
            if usable is not None:
                return usable, "text"
            code_lines.pop()
    return None, None


def _without_main_guard(code):
    """``code`` without its top-level ``if __name__ == "__main__":`` blocks (a demo is not the answer, and one that
    reads input() would fail a right solution)."""
    if not _MAIN_GUARD.search(code):
        return code
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    lines = code.splitlines()
    for node in reversed(tree.body):
        if isinstance(node, ast.If) and _MAIN_GUARD.match(lines[node.lineno - 1]) and node.end_lineno:
            del lines[node.lineno - 1:node.end_lineno]
    return "\n".join(lines)


def mbpp_entry(row):
    """The function an MBPP row's asserts call (``assert square(3) == 9`` -> ``square``), or None."""
    tests = row[CONFIG["test"]]
    first = tests[0] if isinstance(tests, list) and tests else str(tests)
    called = re.search(r"assert\s+(?:not\s+)?\(?\s*(?:set\(|math\.isclose\()?\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(",
                       str(first))
    return called.group(1) if called else None


def build_program(row, completion):
    """The file that is run: prompt + completion (or the completion alone when it redefines everything), tests."""
    if CONFIG["style"] == "mbpp":
        setup = str(row.get(CONFIG.get("setup", "test_setup_code")) or "")
        tests = row[CONFIG["test"]]
        tests = "\n".join(tests) if isinstance(tests, list) else str(tests)
        entry = mbpp_entry(row)
        return f"{setup}\n{_without_main_guard(completion)}\n{_method_alias(completion, entry)}\n{tests}\n"
    prompt = str(row[CONFIG["input"]])
    entry = str(row[CONFIG["entry_point"]])
    defines = _defines(completion, entry)
    if defines:
        # A whole program: keep the prompt's imports and helpers, let the completion's definition win.
        completion = _without_main_guard(completion)
        body = f"{prompt}\n    pass\n\n{completion}" if _stub_only(prompt) else f"{prompt}\n\n{completion}"
        body += _method_alias(completion, entry)  # "" unless a class of it defines the entry point
    else:
        body = prompt + completion  # a body continuing the prompt's signature (HumanEval's completion format)
    return f"{body}\n\n{row[CONFIG['test']]}\n\ncheck({entry})\n"


def _method_alias(code, entry):
    """For a class-based solution (LeetCode's ``class Solution``), the line that makes the entry point its class's
    method, so the tests' ``entry(...)`` calls it; "" when ``code`` defines ``entry`` as a function or not at all."""
    cls = _class_of(code, entry) if entry and _defines(code, entry) == "method" else None
    return f"\n\n{entry} = {cls}().{entry}\n" if cls else ""


def _class_of(code, entry):
    """The name of the top-level class in ``code`` that defines method ``entry``."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(
                isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == entry for f in node.body):
            return node.name
    return None


def _stub_only(prompt):
    """True when the prompt ends in a signature without even a docstring (it would not parse on its own)."""
    return not _parses(prompt)


def run_program(program, timeout_s):
    """Run ``program`` in a child Python; (passed, timed_out, stderr tail). The child and anything it starts are
    killed at the limit."""
    with _SLOTS:
        return _run(program, timeout_s)


def _run(program, timeout_s):
    fd, path = tempfile.mkstemp(suffix=".py", prefix="bw_candidate_")
    with os.fdopen(fd, "w") as f:
        f.write(program)
    try:
        proc = subprocess.Popen([sys.executable, "-B", path], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout_s)
            return proc.returncode == 0, False, err.decode(errors="replace")[-1000:]
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            return False, True, f"timed out after {timeout_s:g} s"
    finally:
        os.unlink(path)


class Scorer:
    def extract(self, row):
        if CONFIG["style"] == "mbpp":
            tests = row[CONFIG["test"]]
            first = tests[0] if isinstance(tests, list) and tests else str(tests)
            return f"{row[CONFIG['input']]}\nYour code should pass this test:\n{first}"
        return f"Complete this Python function:\n\n```python\n{row[CONFIG['input']]}\n```"

    def solve(self, row, call_sut):
        return call_sut([
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.extract(row)},
        ])

    def score(self, row, response):
        humaneval = CONFIG["style"] == "humaneval"
        entry = row.get(CONFIG["entry_point"]) if humaneval else mbpp_entry(row)
        completion, rule = find_code(response, entry, str(row[CONFIG["input"]]) if humaneval else None)
        if completion is None:
            return {"score": 0.0, "answer": None, "extracted": False, "rule": None, "timed_out": False,
                    "stderr": "no code in the reply"}
        timeout_s = CONFIG["timeout_s"]
        assert isinstance(timeout_s, (int, float)), "CONFIG timeout_s is a number of seconds"
        passed, timed_out, err = run_program(build_program(row, completion), float(timeout_s))
        return {"score": 1.0 if passed else 0.0, "answer": hashlib.sha256(completion.encode()).hexdigest()[:12],
                "extracted": True, "rule": rule, "timed_out": timed_out, "stderr": "" if passed else err}
