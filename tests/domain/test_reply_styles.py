"""The reply-style corpus: every builtin template scores replies written the way today's chat and reasoning models
answer (tests/domain/reply_styles/<template>.yaml), right -> 1.0 and wrong -> 0.0, with the audit trail
(``extracted``, ``rule``) as expected.

Each style is run on every row it applies to, through the rendered template (the file that runs in the sandbox):
``Scorer().solve()`` with a ``call_sut`` that answers like the scorer runtime does (``SutText``: the reply's text, its
``tool_calls`` and the provider's separate reasoning field), then ``Scorer().score()`` on what solve returned.

Data file shape::

    template: numeric                      # the template; plan: its ScorerPlan fields
    rows:                                  # realistic rows: a bundled sample's line, or written here
      - {id: gsm8k-0, sample: gsm8k-mini.jsonl, line: 0, tags: [int], vars: {...}, wrong: {...}}
    styles:
      - name: terse
        reply: "{n}"                       # rendered with the row's vars (right) and with its wrong vars (wrong)
        # or right: / wrong: templates, each rendered with the vars and the wrong vars prefixed ``w_``
        reasoning: "..."                   # optional: the provider's separate reasoning field (same rendering)
        only: [int]                        # optional: rows carrying one of these tags
        rule: last_number                  # optional: the rule both replies are read by (wrong_rule for wrong)
        wrong_extracted: false             # optional: the wrong reply holds no answer at all
"""

from __future__ import annotations

import ast
import json
import keyword
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from benchwright.drivers import ScorerPlan
from benchwright.drivers.templates import render_plan
from benchwright.scoring.runner import SutText, output_of

CORPUS = Path(__file__).parent / "reply_styles"
SAMPLES = Path(__file__).resolve().parents[2] / "benchwright" / "samples"
TEMPLATES = ("numeric", "multiple_choice", "exact_match", "code", "tool_call")
MIN_STYLES = 25


def _load(template: str) -> dict[str, Any]:
    return yaml.safe_load((CORPUS / f"{template}.yaml").read_text())  # type: ignore[no-any-return]


def _row(spec: dict[str, Any]) -> dict[str, Any]:
    if "sample" in spec:
        lines = (SAMPLES / spec["sample"]).read_text().splitlines()
        return json.loads(lines[spec["line"]])  # type: ignore[no-any-return]
    return dict(spec["row"])


# ---- derived variables, so one style template serves every row -------------------------------------------------

def _choice_vars(row: dict[str, Any], scorer_ns: Any, spec: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    choices = row["choices"]
    texts = [str(t) for t in (choices["text"] if isinstance(choices, dict) else choices)]
    right = "ABCDEFGH".index(scorer_ns["reference_letter"](row))
    wrong = spec.get("wrong_index", (right + 1) % len(texts))

    def of(i: int) -> dict[str, str]:
        return {"L": "ABCDEFGH"[i], "l": "abcdefgh"[i], "T": texts[i]}

    return of(right), of(wrong)


def _code_vars(row: dict[str, Any], spec: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    prompt, entry = row["prompt"], row["entry_point"]
    lines = prompt.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"def {entry}("))
    imports = "".join(line + "\n" for line in lines[:at] if line.startswith(("import ", "from ")))
    def_line = lines[at]
    fn = next(n for n in ast.parse(prompt).body if isinstance(n, ast.FunctionDef) and n.name == entry)
    params = [a.arg for a in fn.args.args]
    header = def_line[len("def "):]
    signature = header[header.index("("):]

    def of(body: str) -> dict[str, str]:
        body = body.rstrip("\n") + "\n"
        return {
            "prompt": prompt, "imports": imports, "def": def_line, "entry": entry, "demo": spec["demo"],
            "body": body,
            "body_tabs": re.sub(r"^((?:    )+)", lambda m: "\t" * (len(m.group(1)) // 4), body, flags=re.MULTILINE),
            "body_flush": "\n".join(line[4:] if line.startswith("    ") else line for line in body.splitlines()) + "\n",
            "body_in_class": "".join(("    " + line if line.strip() else line) + "\n" for line in body.splitlines()),
            "full": f"{imports}\n{def_line}\n{body}",
            "full_in_list": "".join(("   " + line if line.strip() else line) + "\n"
                                    for line in f"{imports}\n{def_line}\n{body}".splitlines()),
            # markdown's indented code block (four spaces, no fence), and indentation in no-break spaces
            "full_indented": "".join(("    " + line if line.strip() else line) + "\n"
                                     for line in f"{imports}\n{def_line}\n{body}".splitlines()),
            "full_nbsp": f"{imports}\n{def_line}\n" + re.sub(r"^ +", lambda m: "\u00a0" * len(m.group()), body,
                                                             flags=re.MULTILINE),
            "full_tabs": f"{imports}\n{def_line}\n" + re.sub(r"^((?:    )+)", lambda m: "\t" * (len(m.group(1)) // 4),
                                                            body, flags=re.MULTILINE),
            "method_def": f"def {entry}(self, {signature[1:]}" if params else f"def {entry}(self){signature[2:]}",
            "helper_def": f"def _{entry}_impl{signature}",
            "args": ", ".join(params),
        }

    return of(spec.get("body") or row["canonical_solution"]), of(spec["wrong_body"])


def _tool_vars(row: dict[str, Any], spec: dict[str, Any], args_style: str) -> tuple[dict[str, Any], dict[str, Any]]:
    truth = row["ground_truth"]
    calls = [truth] if isinstance(truth, dict) else [
        {"name": name, "arguments": {k: v[0] for k, v in args.items() if v[0] != ""}}
        for item in truth for name, args in item.items()]
    wrong = json.loads(json.dumps(calls))
    wrong[0]["arguments"].update(spec["wrong_args"])

    def styled(value: Any) -> Any:
        if args_style == "strings" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if args_style == "strings" and isinstance(value, bool):
            return str(value).lower()
        if args_style == "spaced" and isinstance(value, str):
            return f"  {value} "
        return value

    def of(cs: list[dict[str, Any]]) -> dict[str, Any]:
        cs = [{"name": c["name"], "arguments": {k: styled(v) for k, v in c["arguments"].items()}} for c in cs]
        wire = [{"name": c["name"].replace(".", "_"), "arguments": c["arguments"]} for c in cs]
        py = [f"{c['name']}(" + ", ".join(f"{k}={v!r}" for k, v in c["arguments"].items()) + ")" for c in cs]
        # Python that parses: an argument named like a keyword gets PEP 8's trailing underscore ("from_")
        pep8 = [f"{c['name']}(" + ", ".join(f"{k}_={v!r}" if keyword.iskeyword(k) else f"{k}={v!r}"
                                            for k, v in c["arguments"].items()) + ")" for c in cs]
        return {
            "native": [{"id": f"call_{i}", "type": "function",
                        "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                       for i, c in enumerate(wire)],
            "calls_json": json.dumps(cs), "calls_pretty": json.dumps(cs, indent=2),
            "calls_lines": "\n".join(json.dumps(c) for c in cs),
            "calls_tags": "\n".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in cs),
            "calls_openai": json.dumps([{"type": "function", "function": {"name": c["name"],
                                                                         "arguments": json.dumps(c["arguments"])}}
                                        for c in cs]),
            "calls_params": json.dumps([{"function": c["name"], "parameters": c["arguments"]} for c in cs]),
            "calls_py": "\n".join(py), "calls_py_list": "[" + ", ".join(py) + "]", "calls_py_pep8": "\n".join(pep8),
            "spaced_json": "\n".join(json.dumps(c, indent=4).replace(": ", " :   ") for c in cs),
            "calls_wire_json": json.dumps(wire), "calls_cut": json.dumps(cs)[:len(json.dumps(cs[0])) // 2],
            # A model's own markup, as a server without its tool parser passes it on (the names it was sent: wire).
            "calls_function_tags": "".join(f"<function={c['name']}>{json.dumps(c['arguments'])}</function>"
                                           for c in wire),
            "calls_mistral": "".join(f"[TOOL_CALLS]{c['name']}[ARGS]{json.dumps(c['arguments'])}" for c in wire),
            "calls_deepseek": "<\uff5ctool\u2581calls\u2581begin\uff5c>" + "\n".join(
                f"<\uff5ctool\u2581call\u2581begin\uff5c>function<\uff5ctool\u2581sep\uff5c>{c['name']}\n```json\n"
                f"{json.dumps(c['arguments'])}\n```<\uff5ctool\u2581call\u2581end\uff5c>" for c in wire)
                + "<\uff5ctool\u2581calls\u2581end\uff5c>",
            # Claude's XML for calls described in the prompt: every value as text
            "calls_invoke": "<function_calls>\n" + "".join(
                f'<invoke name="{c["name"]}">\n' + "".join(
                    f'<parameter name="{k}">{v if isinstance(v, str) else json.dumps(v)}</parameter>\n'
                    for k, v in c["arguments"].items()) + "</invoke>\n" for c in cs) + "</function_calls>",
            # A ReAct agent's step (one call a step: the first)
            "calls_react": f"Thought: I should call the tool.\nAction: {cs[0]['name']}\n"
                           f"Action Input: {json.dumps(cs[0]['arguments'])}",
            # A LangChain JSON agent's action (one call a step: the first)
            "calls_langchain": json.dumps({"action": cs[0]["name"], "action_input": cs[0]["arguments"]}),
            # Qwen3-Coder's (and Seed-OSS's) XML, GLM-4.5's keys and values, FunctionGemma's call: every value as text
            "calls_qwen_xml": "\n".join(
                f"<tool_call>\n<function={c['name']}>\n" + "".join(
                    f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
                    for k, v in c["arguments"].items()) + "</function>\n</tool_call>" for c in wire),
            "calls_glm": "\n".join(
                f"<tool_call>{c['name']}\n" + "".join(
                    f"<arg_key>{k}</arg_key>\n<arg_value>{v if isinstance(v, str) else json.dumps(v)}</arg_value>\n"
                    for k, v in c["arguments"].items()) + "</tool_call>" for c in wire),
            "calls_function_gemma": "".join(
                f"<start_function_call>call:{c['name']}{{" + ",".join(
                    f"{k}:<escape>{v}<escape>" if isinstance(v, str) else f"{k}:{json.dumps(v)}"
                    for k, v in c["arguments"].items()) + "}<end_function_call>" for c in wire),
            # gpt-oss's harmony messages, Kimi K2's sections, Functionary's ">>>" lines: the name, then JSON arguments
            "calls_harmony": "".join(
                f"<|start|>assistant<|channel|>commentary to=functions.{c['name']} <|constrain|>json<|message|>"
                f"{json.dumps(c['arguments'])}<|call|>" for c in wire),
            "calls_kimi": "<|tool_calls_section_begin|>" + "".join(
                f"<|tool_call_begin|>functions.{c['name']}:{i}<|tool_call_argument_begin|>{json.dumps(c['arguments'])}"
                f"<|tool_call_end|>" for i, c in enumerate(wire)) + "<|tool_calls_section_end|>",
            "calls_functionary": "\n".join(f">>>{c['name']}\n{json.dumps(c['arguments'])}" for c in wire),
            # OpenAI's legacy message: one function_call, its arguments a JSON string
            "calls_legacy": json.dumps({"role": "assistant", "content": None, "function_call": {
                "name": wire[0]["name"], "arguments": json.dumps(wire[0]["arguments"])}}),
            # Gemini's code block, its calls on the default API, under the names it was sent (wire)
            "calls_gemini": "```tool_code\n" + "\n".join(
                f"print(default_api.{c['name']}(" + ", ".join(f"{k}={v!r}" for k, v in c["arguments"].items()) + "))"
                for c in wire) + "\n```",
        }

    return of(calls), of(wrong)


# ---- the cases ---------------------------------------------------------------------------------------------------

def _render(template: str, values: dict[str, Any]) -> str:
    return template.format(**{k: v for k, v in values.items() if isinstance(v, str)})


def _applies(style: dict[str, Any], spec: dict[str, Any]) -> bool:
    """Whether ``style`` runs on the row ``spec``: its ``only`` tags (one of them) and none of its ``skip`` tags."""
    tags = set(spec.get("tags", []))
    return (not style.get("only") or bool(set(style["only"]) & tags)) and not set(style.get("skip", [])) & tags


def _cases() -> list[Any]:
    out = []
    for template in TEMPLATES:
        if not (CORPUS / f"{template}.yaml").exists():
            continue  # test_corpus_size fails for it
        data = _load(template)
        for spec in data["rows"]:
            row = _row(spec)
            for style in data["styles"]:
                if not _applies(style, spec):
                    continue
                out.append(pytest.param(template, data["plan"], spec, row, style,
                                        id=f"{template}-{style['name']}-{spec['id']}"))
    return out


def _vars(template: str, spec: dict[str, Any], row: dict[str, Any],
          style: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    if template == "multiple_choice":
        right, wrong = _choice_vars(row, _NAMESPACES[template], spec)
    elif template == "code":
        right, wrong = _code_vars(row, spec)
    elif template == "tool_call":
        right, wrong = _tool_vars(row, spec, style.get("args", "as_is"))
    else:
        right, wrong = dict(spec["vars"]), {**spec["vars"], **spec["wrong"]}
        for side in (right, wrong):
            if "a" in side:
                side.update(a_lower=side["a"].lower(), a_upper=side["a"].upper())
    return right, wrong


_NAMESPACES: dict[str, dict[str, Any]] = {}


def _namespace(template: str, plan: dict[str, str]) -> dict[str, Any]:
    if template not in _NAMESPACES:
        ns: dict[str, Any] = {"__name__": "task_impl"}
        source = render_plan(ScorerPlan(template=template, fields=plan, why=""), code_timeout_s=10.0)
        exec(compile(source, "task_impl.py", "exec"), ns)  # the file under test, as Atomize writes it
        _NAMESPACES[template] = ns
    return _NAMESPACES[template]


def _reply(style: dict[str, Any], values: dict[str, Any], other: dict[str, Any], key: str) -> SutText:
    """The ``key`` ("right"/"wrong") reply of a style: its template rendered with that side's variables, the other
    side's prefixed ``w_`` (so "{w_n}... wait, no, {n}" corrects a wrong answer to the right one, and vice versa)."""
    mine, theirs = (values, other) if key == "right" else (other, values)
    both = {**mine, **{f"w_{k}": v for k, v in theirs.items()}}
    text = _render(style.get(key, style.get("reply", "")), both)
    reasoning = _render(style.get(f"reasoning_{key}", style.get("reasoning", "")), both)
    return SutText(text, mine["native"] if style.get("via") == "tool_calls" else [], reasoning)


@pytest.mark.parametrize(("template", "plan", "spec", "row", "style"), _cases())
def test_reply_style(template: str, plan: dict[str, str], spec: dict[str, Any], row: dict[str, Any],
                     style: dict[str, Any]) -> None:
    ns = _namespace(template, plan)
    right_vars, wrong_vars = _vars(template, spec, row, style)

    def run(key: str) -> tuple[SutText, Any, dict[str, Any]]:
        reply = _reply(style, right_vars, wrong_vars, key)
        solved = ns["Scorer"]().solve(row, lambda *_a, **_k: reply)
        return reply, solved, ns["Scorer"]().score(row, solved)

    with ThreadPoolExecutor(2) as pool:  # the code template runs each candidate in a child process
        runs = dict(zip(("right", "wrong"), pool.map(run, ("right", "wrong")), strict=True))
    for key, score in (("right", 1.0), ("wrong", 0.0)):
        reply, solved, result = runs[key]
        shown = f"{key} reply {str(reply)!r} (reasoning {reply.reasoning!r}) -> {result}"
        assert result["score"] == score, shown
        extracted = style.get(f"{key}_extracted", True)
        assert result["extracted"] is extracted, shown
        assert (result["answer"] is not None) is extracted, shown
        rule = style.get(f"{key}_rule", style.get("rule"))
        if not extracted:
            assert result["rule"] is None, shown
        elif rule is not None:
            assert result["rule"] == rule, shown
        if reply.reasoning:  # the reasoning is never scored, and the trial's output shows it
            shows = json.loads(solved)["reasoning"] if template == "tool_call" else output_of(solved)
            assert reply.reasoning in (shows or ""), shown


@pytest.mark.parametrize("template", TEMPLATES)
def test_corpus_size(template: str) -> None:
    data = _load(template)
    names = [s["name"] for s in data["styles"]]
    assert len(names) == len(set(names)), "style names are unique"
    assert len(names) >= MIN_STYLES, f"{template}: {len(names)} styles, at least {MIN_STYLES} wanted"
    assert len(data["rows"]) >= 3


def test_a_reply_to_another_question_never_scores_right() -> None:
    """Every exact_match style's right reply for one row, scored against each other row: never right. A rule that
    accepts more than the answer itself (a description before a name, words of the question beside it) must not
    accept another question's answer, nor a guess a reply denies (it found "Many people assume Sydney. The capital of
    Australia is Canberra." scored right for the decoy row, Australia's largest city)."""
    data = _load("exact_match")
    ns = _namespace("exact_match", data["plan"])
    specs = [(spec, _row(spec)) for spec in data["rows"]]
    replies = []
    for spec, row in specs:
        for style in data["styles"]:
            if not _applies(style, spec):
                continue
            right, wrong = _vars("exact_match", spec, row, style)
            replies.append((spec["id"], style["name"], str(_reply(style, right, wrong, "right"))))
    rights = []
    for spec, row in specs:
        for source, name, reply in replies:
            if source != spec["id"] and ns["Scorer"]().score(row, reply)["score"] != 0.0:
                rights.append(f"{name} written for {source}, scored right for {spec['id']}: {reply!r}")
    assert len(replies) > 1000
    assert not rights, "\n".join(rights[:20])
