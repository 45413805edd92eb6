"""task_impl.py written by Benchwright's builtin driver: code generation, scored by running the tests
(HumanEval / MBPP style).

HumanEval rows: ``prompt`` (signature + docstring), ``test`` (defines ``check(candidate)``), ``entry_point``.
MBPP rows: ``text`` (the task), ``test_list`` (assert lines) and optional ``test_setup_code``. The completion is
taken from the reply with markdown fences and prose stripped, joined to the prompt, and run with the tests in a
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
import threading

CONFIG = {"style": "humaneval", "input": "prompt", "test": "test", "entry_point": "entry_point", "timeout_s": 5.0}
SYSTEM_PROMPT = "You are an expert Python programmer. Reply with the complete code in one ```python block."
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
# The scorer runs many tasks on threads: at most this many candidate programs run at once, so a sweep at
# concurrency 128 does not start 128 interpreters on the sandbox's one core and time slow-but-correct ones out
# while they wait for the CPU (the limit measures the candidate's own run; waiting for a slot counts only against
# the attempt's duration). Measured on 2 cores: 64 trivial candidates took 1.05 s all at once, 1.34 s through 2
# slots (~20 ms of interpreter start each).
_SLOTS = threading.BoundedSemaphore(max(2, os.cpu_count() or 2))
_CODE_START = re.compile(r"^(?:def |async def |class |import |from |@|[A-Za-z_][A-Za-z0-9_]*\s*=|if |for |while |"
                         r"return |    |\t)")


def _parses(code):
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


def extract_code(reply, entry_point=None):
    """The code in a reply: the fenced block that defines ``entry_point`` (else the first python/untagged block);
    without fences, the reply from its first code-looking line, trimmed of trailing prose until it parses."""
    text = str(reply or "")
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    if blocks:
        python = [b for lang, b in blocks if lang in ("python", "py", "python3", "")] or [b for _, b in blocks]
        if entry_point:
            for body in python:
                if re.search(r"def\s+" + re.escape(entry_point) + r"\s*\(", body):
                    return body.strip("\n")
        return python[0].strip("\n")
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _CODE_START.match(line)), None)
    if start is None:
        return text
    code_lines = lines[start:]
    while code_lines and not _parses("\n".join(code_lines)):
        code_lines.pop()
    return "\n".join(code_lines) if code_lines else "\n".join(lines[start:])


def build_program(row, completion):
    """The file that is run: prompt + completion (or the completion alone when it redefines everything), tests."""
    if CONFIG["style"] == "mbpp":
        setup = str(row.get(CONFIG.get("setup", "test_setup_code")) or "")
        tests = row[CONFIG["test"]]
        tests = "\n".join(tests) if isinstance(tests, list) else str(tests)
        return f"{setup}\n{completion}\n\n{tests}\n"
    prompt = str(row[CONFIG["input"]])
    entry = str(row[CONFIG["entry_point"]])
    if re.search(r"^\s*def\s+" + re.escape(entry) + r"\s*\(", completion, re.MULTILINE):
        # A whole function: keep the prompt's imports and helpers, let the completion's definition win.
        body = f"{prompt}\n    pass\n\n{completion}" if _stub_only(prompt) else f"{prompt}\n\n{completion}"
    else:
        body = prompt + completion  # a body continuing the prompt's signature (HumanEval's completion format)
    return f"{body}\n\n{row[CONFIG['test']]}\n\ncheck({entry})\n"


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
        entry = row.get(CONFIG["entry_point"]) if CONFIG["style"] == "humaneval" else None
        completion = extract_code(response, entry)
        timeout_s = CONFIG["timeout_s"]
        assert isinstance(timeout_s, (int, float)), "CONFIG timeout_s is a number of seconds"
        passed, timed_out, err = run_program(build_program(row, completion), float(timeout_s))
        return {"score": 1.0 if passed else 0.0, "answer": hashlib.sha256(completion.encode()).hexdigest()[:12],
                "timed_out": timed_out, "stderr": "" if passed else err}
