"""task_impl.py written by Benchwright's builtin driver: JSON tool call (BFCL style).

The row holds the user's request (a string or a list of chat messages), the functions the model may call (OpenAI
``{"type": "function", "function": {...}}`` or bare ``{"name", "description", "parameters"}``), and the expected
call(s): ``{"name": ..., "arguments": {...}}``, a list of those, or BFCL's ``[{"<name>": {"<arg>": [allowed
values...]}}]`` (an empty string among the allowed values marks the argument optional). The request carries the
functions as ``tools``; the model's ``tool_calls`` (or, failing those, calls written in its text's answer part:
``<tool_call>`` tags or a model's own markup, fenced or bare JSON, Python ``name(arg=value)``, ``from_=`` for a
parameter ``from``; see ``find_calls``) are compared structurally: names equal, arguments equal after normalising each
value to the type the function's schema declares ("1" and 1 for an integer, "true" for a boolean), objects and multiple
calls order-insensitive. Standard library only.
CONFIG: ``input``, ``functions`` and ``reference`` columns.
"""

import ast
import json
import keyword
import re

from benchwright.drivers.templates._reply import answer_part, reasoning_of  # inlined by render()

CONFIG = {"input": "question", "functions": "functions", "reference": "ground_truth"}
SYSTEM_PROMPT = "Call the function that fulfils the user's request, with the right arguments."
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")


def _loads(value):
    return json.loads(value) if isinstance(value, str) and value.strip()[:1] in "[{" else value


def functions_of(row):
    """The row's function schemas, bare (``name``, ``description``, ``parameters``)."""
    value = _loads(row[CONFIG["functions"]])
    if isinstance(value, dict):
        value = [value]
    out = []
    for item in value:
        fn = item.get("function", item) if isinstance(item, dict) else None
        if not isinstance(fn, dict) or "name" not in fn:
            raise ValueError(f"a function schema without a name: {item!r}")
        out.append(fn)
    return out


def wire_name(name):
    """OpenAI allows [A-Za-z0-9_-] in tool names; BFCL names like 'math.factorial' travel as 'math_factorial'."""
    return _SAFE_NAME.sub("_", name)


def tools_of(row):
    return [{"type": "function", "function": {"name": wire_name(fn["name"]), "description": fn.get("description", ""),
                                              "parameters": _openai_schema(fn.get("parameters") or {})}}
            for fn in functions_of(row)]


def _openai_schema(schema):
    """BFCL writes 'dict'/'float'/'tuple' where JSON Schema says object/number/array."""
    if isinstance(schema, dict):
        out = {k: _openai_schema(v) for k, v in schema.items()}
        kind = out.get("type")
        if isinstance(kind, str):
            out["type"] = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}.get(kind, kind)
        return out
    if isinstance(schema, list):
        return [_openai_schema(v) for v in schema]
    return schema


def messages_of(row):
    value = _loads(row[CONFIG["input"]])
    while isinstance(value, list) and value and isinstance(value[0], list):  # BFCL nests turns: [[{...}]]
        value = value[0]
    if isinstance(value, list):
        return [{"role": "system", "content": SYSTEM_PROMPT}, *value]
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": str(value)}]


def normalize(value, schema):
    """``value`` coerced to the type ``schema`` declares (when it can be), recursively; strings stripped."""
    kind = (schema or {}).get("type")
    kind = {"dict": "object", "float": "number", "tuple": "array"}.get(str(kind), kind)
    try:
        if kind == "integer" and isinstance(value, (str, float)) and not isinstance(value, bool):
            as_float = float(value)
            return int(as_float) if as_float.is_integer() else as_float
        if kind == "number" and isinstance(value, (str, int)) and not isinstance(value, bool):
            return float(value)
        if kind == "boolean" and isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if kind == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if kind == "array" and isinstance(value, str):
            value = json.loads(value)
        if kind == "object" and isinstance(value, str):
            value = json.loads(value)
    except ValueError:
        return value
    if isinstance(value, list):
        return [normalize(v, (schema or {}).get("items")) for v in value]
    if isinstance(value, dict):
        props = (schema or {}).get("properties") or {}
        return {k: normalize(v, props.get(k)) for k, v in value.items()}
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, float) and value.is_integer() and kind not in ("number",):
        return int(value)
    return value


def parse_calls(response, row):
    """The model's calls as [(name, arguments)] (see :func:`find_calls`)."""
    return find_calls(response, row)[0]


def find_calls(response, row):
    """([(name, arguments)], rule) from what solve() returned: the reply's ``tool_calls`` (rule ``tool_calls``),
    else calls written in the text's answer part (a reasoning block skipped): in ``<tool_call>`` tags or a model's
    own markup (``tool_call_tag``: Hermes/Qwen's tags, Llama's ``<function=...>``, Mistral's ``[TOOL_CALLS]``,
    DeepSeek's, Claude's ``<invoke>`` XML, a ReAct agent's "Action:"/"Action Input:", Qwen3-Coder's and Seed-OSS's
    ``<parameter=...>`` XML, GLM-4.5's ``<arg_key>``/``<arg_value>``, FunctionGemma's ``call:name{...}``, gpt-oss's
    harmony ``to=functions.name``, Kimi K2's sections, Functionary's ``>>>name``), in fenced blocks (``fence``), as
    bare JSON (``json``: an object, a list, or one object per line), or as Python calls ``name(arg=value)``
    (``python_call``, BFCL's own notation; Gemini's ``default_api.name(...)`` too). ([], None) when the reply holds no
    call."""
    names = {wire_name(fn["name"]): fn["name"] for fn in functions_of(row)}
    try:
        data = json.loads(response) if isinstance(response, str) else response
    except ValueError:
        data = None
    if not isinstance(data, dict) or not {"content", "tool_calls"} & set(data):
        data = {"content": str(response or "")}  # the reply's text itself, not what solve() wrote
    calls, rule = data.get("tool_calls") or [], "tool_calls"
    if not calls:
        calls, rule = _calls_in_text(answer_part(data.get("content")), row)
    out = []
    for call in calls:
        call = _call_shape(call)
        if call is None:
            continue
        name, args = call
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                args = {"__unparsable__": args}
        out.append((names.get(name, name), args if isinstance(args, dict) else {}))
    return out, (rule if out else None)


def _call_shape(call):
    """(name, arguments) of a call in any of the shapes models write, or None when ``call`` is not a call."""
    if not isinstance(call, dict):
        return None
    inner = call.get("function")
    fn = inner if isinstance(inner, dict) else call
    name = fn.get("name")
    if name is None and isinstance(call.get("function"), str):
        name = call["function"]
    if name is None and isinstance(call.get("function_call"), dict):  # OpenAI's legacy message shape
        fn = call["function_call"]
        name = fn.get("name")
    if name is None:  # LangChain's agents: {"tool_name", "tool_input"}, {"action", "action_input"}
        name = call.get("tool") or call.get("tool_name") or call.get("action")
    if not isinstance(name, str):
        return None
    for key in ("arguments", "parameters", "args", "tool_input", "action_input", "input"):
        if key in fn:
            return name, fn[key]
        if key in call:
            return name, call[key]
    return name, {}


def _json_values(text):
    """Every JSON object or list in ``text``, left to right (one inside another counts once, as the outer)."""
    out: list = []
    i, decoder = 0, json.JSONDecoder()
    while True:
        starts = [j for j in (text.find("{", i), text.find("[", i)) if j != -1]
        if not starts:
            return out
        j = min(starts)
        try:
            value, end = decoder.raw_decode(text, j)
        except ValueError:
            i = j + 1
            continue
        out.append(value)
        i = end


def _json_calls(text):
    calls = []
    for value in _json_values(text):
        for item in value if isinstance(value, list) else [value]:
            if _call_shape(item) is not None:
                calls.append(item)
    return calls


def _param(name, params):
    """A keyword argument's parameter: a Python keyword written with PEP 8's trailing underscore ("from_", the way a
    model writes Python that parses) is the parameter "from" when the function has no "from_"."""
    base = name[:-1] if name.endswith("_") else None
    return base if base and keyword.iskeyword(base) and base in params and name not in params else name


def _python_calls(text, row):
    """Calls written as Python, ``math.factorial(number=5)`` (BFCL's notation), with literal arguments."""
    fns = {}
    for fn in functions_of(row):
        fns[fn["name"]] = fn
        fns[wire_name(fn["name"])] = fn
    found = []
    for name, fn in fns.items():
        # "default_api." is how Gemini writes a call in a ```tool_code block: print(default_api.name(city="Paris"))
        for m in re.finditer(r"(?:(?<=\bdefault_api\.)|(?<![\w.]))" + re.escape(name) + r"\s*\(", text):
            depth, j = 0, m.end() - 1
            while j < len(text):
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
                if depth == 0:
                    break
            source = text[m.start():j].replace(name, "f", 1)
            # an argument named like a Python keyword ("from", "class") would not parse: renamed and back
            source = re.sub(r"(?<=[(,\s])(" + "|".join(keyword.kwlist) + r")(\s*=)(?!=)", r"\1__kw\2", source)
            try:
                node = ast.parse(source, mode="eval").body
                if not isinstance(node, ast.Call):
                    continue
                order = list((fn.get("parameters") or {}).get("properties") or {})
                args = {order[k]: ast.literal_eval(a) for k, a in enumerate(node.args) if k < len(order)}
                args.update({_param(kw.arg.removesuffix("__kw"), order): ast.literal_eval(kw.value)
                             for kw in node.keywords if kw.arg})
            except (SyntaxError, ValueError, TypeError):
                continue
            found.append((m.start(), {"name": fn["name"], "arguments": args}))
    return [call for _, call in sorted(found, key=lambda x: x[0])]


# A model's own tool-call markup, passed through as text by a server without a tool parser for it: the function's
# name, then its arguments as one JSON object. Llama 3.1's custom tools: <function=name>{...}</function>; Mistral's
# (v11 tokenizer): [TOOL_CALLS]name[ARGS]{...}; DeepSeek V3/R1's: its tool-call-begin token, "function", its
# tool-sep token, the name, a ```json block, its tool-call-end token; a ReAct agent's "Action: name" then "Action
# Input: {...}"; Functionary's ">>>name" line; gpt-oss's harmony "to=functions.name <|constrain|>json<|message|>";
# Kimi K2's "<|tool_call_begin|>functions.name:0<|tool_call_argument_begin|>".
_NATIVE_MARKUP = re.compile(r"<function=([\w.\-]+)>"
                            r"|\[TOOL_CALLS\]\s*([\w.\-]+)\s*\[ARGS\]"
                            r"|<\uff5ctool\u2581call\u2581begin\uff5c>\s*function\s*<\uff5ctool\u2581sep\uff5c>\s*([\w.\-]+)"
                            r"\s*(?:```[ \t]*(?:json)?[ \t]*\n?)?"
                            r"|(?:^|\n)[ \t]*Action:[ \t]*`?([\w.\-]+)`?[ \t]*\n[ \t]*Action Input:[ \t]*"
                            r"|(?:^|\n)>>>[ \t]*([\w.\-]+)[ \t]*\n"
                            r"|\bto=functions\.([\w.\-]+)(?:[ \t]*(?:<\|constrain\|>)?[ \t]*json)?"
                            r"[ \t]*(?:<\|message\|>)?"
                            r"|<\|tool_call_begin\|>[ \t]*functions\.([\w.\-]+?)(?::\d+)?[ \t]*"
                            r"<\|tool_call_argument_begin\|>")
# Claude's XML for calls described in the prompt: <invoke name="..."><parameter name="city">Paris</parameter></invoke>
# (each value as text: a number, a boolean, a list or an object is read as JSON where it is one).
_INVOKE = re.compile(r"<invoke\s+name=\"([\w.\-]+)\"\s*>(.*?)</invoke>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter\s+name=\"([^\"]+)\"\s*>(.*?)</parameter>", re.DOTALL)
# Calls whose arguments are tagged one by one, each value as text (read as JSON where it is a number, a boolean, a list
# or an object): Qwen3-Coder's and Seed-OSS's "<function=name><parameter=city>Paris</parameter></function>", GLM-4.5's
# "<tool_call>name<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>", FunctionGemma's
# "call:name{city:<escape>Paris<escape>}".
_TAGGED_CALL = re.compile(r"<function=([\w.\-]+)>(\s*<parameter=.*?)</function>"
                          r"|<tool_call>\s*([\w.\-]+)\s*((?:<arg_key>.*?</arg_key>\s*<arg_value>.*?</arg_value>\s*)+)"
                          r"|\bcall:([\w.\-]+)\{(.*?)\}(?=\s*(?:<end_function_call>|$|call:))", re.DOTALL)
_TAGGED_ARGUMENT = re.compile(r"<parameter=([^>\s]+)>(.*?)</parameter>|<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)"
                              r"</arg_value>|(\w+):(?:<escape>(.*?)<escape>|([^,}]*))", re.DOTALL)


def _native_calls(text):
    """Calls in a model's native markup (``_NATIVE_MARKUP``): each name with the JSON object right after it."""
    calls, decoder = [], json.JSONDecoder()
    for m in _NATIVE_MARKUP.finditer(text):
        rest = text[m.end():]
        try:
            args, _ = decoder.raw_decode(rest, len(rest) - len(rest.lstrip()))
        except ValueError:
            continue
        if isinstance(args, dict):
            calls.append({"name": next(g for g in m.groups() if g), "arguments": args})
    return calls


def _typed(value):
    """An argument written as text: the JSON value it spells ("5", "true", "[1, 2]", "\"Paris\""), else the text itself
    ("Paris")."""
    value = value.strip()
    try:
        return json.loads(value)
    except ValueError:
        return value


def _invoke_calls(text):
    """Calls in Claude's XML (``_INVOKE``), each parameter's text typed (``_typed``), or in the markup whose arguments
    are tagged one by one (``_TAGGED_CALL``)."""
    calls = [{"name": name, "arguments": {key: _typed(value) for key, value in _PARAMETER.findall(body)}}
             for name, body in _INVOKE.findall(text)]
    for m in _TAGGED_CALL.finditer(text):
        body = m.group(2) or m.group(4) or m.group(6) or ""
        args = {}
        for a in _TAGGED_ARGUMENT.finditer(body):
            key = a.group(1) or a.group(3) or a.group(5)
            value = next((v for v in (a.group(2), a.group(4), a.group(6), a.group(7)) if v is not None), "")
            args[key.strip()] = _typed(value)
        calls.append({"name": m.group(1) or m.group(3) or m.group(5), "arguments": args})
    return calls


def _calls_in_text(text, row):
    """([call], rule) for calls written in the reply's text."""
    text = str(text or "")
    tagged = re.findall(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", text, re.DOTALL)
    calls = [c for block in tagged for c in _json_calls(block)] or _native_calls(text) or _invoke_calls(text)
    if calls:
        return calls, "tool_call_tag"
    fenced = [body for _, body in re.findall(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", text, re.DOTALL)]
    calls = [c for block in fenced for c in _json_calls(block)]
    if calls:
        return calls, "fence"
    calls = [c for block in fenced for c in _python_calls(block, row)]
    if calls:
        return calls, "fence"
    calls = _json_calls(text)
    if calls:
        return calls, "json"
    calls = _python_calls(text, row)
    return (calls, "python_call") if calls else ([], None)


def expected_calls(row):
    """[(name, {arg: [allowed values]}, optional arg names)] from either reference form."""
    value = _loads(row[CONFIG["reference"]])
    value = value if isinstance(value, list) else [value]
    out: list = []
    for item in value:
        item = _loads(item)
        if isinstance(item, dict) and "name" in item and isinstance(item.get("arguments", {}), (dict, str)):
            args = _loads(item.get("arguments") or {})
            out.append((item["name"], {k: [v] for k, v in args.items()}, set()))
        elif isinstance(item, dict) and len(item) == 1:  # BFCL: {"name": {"arg": [allowed, ...]}}
            name, args = next(iter(item.items()))
            allowed = {k: (v if isinstance(v, list) else [v]) for k, v in (args or {}).items()}
            out.append((name, {k: [x for x in v if x != ""] for k, v in allowed.items()},
                        {k for k, v in allowed.items() if "" in v}))
        else:
            raise ValueError(f"cannot read the expected call {item!r}")
    return out


def _call_matches(call, expected, schemas):
    name, args = call
    exp_name, allowed, optional = expected
    if name != exp_name:
        return False
    params = (schemas.get(name) or {}).get("properties") or {}
    if set(args) - set(allowed):
        return False
    for arg, values in allowed.items():
        if arg not in args:
            if arg in optional:
                continue
            return False
        got = normalize(args[arg], params.get(arg))
        if not any(got == normalize(v, params.get(arg)) for v in values):
            return False
    return True


def calls_match(calls, expected, row):
    """Every expected call matched by exactly one model call, in any order, and no extra calls."""
    if len(calls) != len(expected):
        return False
    schemas = {fn["name"]: fn.get("parameters") or {} for fn in functions_of(row)}
    left = list(calls)
    for exp in expected:
        hit = next((c for c in left if _call_matches(c, exp, schemas)), None)
        if hit is None:
            return False
        left.remove(hit)
    return True


class Scorer:
    def extract(self, row):
        return messages_of(row)

    def solve(self, row, call_sut):
        reply = call_sut(self.extract(row), tools=tools_of(row))
        calls = [{"name": c.get("function", c).get("name"),
                  "arguments": c.get("function", c).get("arguments")}
                 for c in (getattr(reply, "tool_calls", None) or [])]
        out = {"tool_calls": calls, "content": str(reply)} if calls else {"content": str(reply)}
        if reasoning_of(reply):  # kept in the trial's output for the user; never scored
            out["reasoning"] = reasoning_of(reply)
        return json.dumps(out)

    def score(self, row, response):
        calls, rule = find_calls(response, row)
        ok = calls_match(calls, expected_calls(row), row)
        answer = json.dumps(sorted([[n, a] for n, a in calls], key=json.dumps), sort_keys=True) if calls else None
        return {"score": 1.0 if ok else 0.0, "answer": answer, "extracted": bool(calls), "rule": rule}
