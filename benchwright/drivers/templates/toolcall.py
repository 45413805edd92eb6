"""task_impl.py written by Benchwright's builtin driver: JSON tool call (BFCL style).

The row holds the user's request (a string or a list of chat messages), the functions the model may call (OpenAI
``{"type": "function", "function": {...}}`` or bare ``{"name", "description", "parameters"}``), and the expected
call(s): ``{"name": ..., "arguments": {...}}``, a list of those, or BFCL's ``[{"<name>": {"<arg>": [allowed
values...]}}]`` (an empty string among the allowed values marks the argument optional). The request carries the
functions as ``tools``; the model's ``tool_calls`` (or, failing those, a JSON call written in its text) are compared
structurally: names equal, arguments equal after normalising each value to the type the function's schema declares
("1" and 1 for an integer, "true" for a boolean), objects and multiple calls order-insensitive. Standard library only.
CONFIG: ``input``, ``functions`` and ``reference`` columns.
"""

import json
import re

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
    """The model's calls as [(name, arguments)], from the JSON solve() returned (tool_calls, else JSON text)."""
    names = {wire_name(fn["name"]): fn["name"] for fn in functions_of(row)}
    try:
        data = json.loads(response) if isinstance(response, str) else response
    except ValueError:
        data = None
    calls = data.get("tool_calls") if isinstance(data, dict) else None
    if not calls:
        calls = _calls_in_text(data.get("content") if isinstance(data, dict) else str(response or ""))
    out = []
    for call in calls or []:
        fn = call.get("function", call)
        args = fn.get("arguments", fn.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                args = {"__unparsable__": args}
        out.append((names.get(fn.get("name"), fn.get("name")), args if isinstance(args, dict) else {}))
    return out


def _calls_in_text(text):
    """A call written as JSON in the reply's text (fenced or bare): an object, or a list of them."""
    text = str(text or "")
    fenced = re.findall(r"```(?:json)?\s*(.*?)```", text, re.DOTALL)
    for candidate in [*fenced, text]:
        start = min([i for i in (candidate.find("{"), candidate.find("[")) if i != -1], default=-1)
        if start == -1:
            continue
        try:
            value, _ = json.JSONDecoder().raw_decode(candidate[start:])
        except ValueError:
            continue
        value = value if isinstance(value, list) else [value]
        if all(isinstance(v, dict) and "name" in v.get("function", v) for v in value):
            return value
    return []


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
        return json.dumps({"tool_calls": calls, "content": str(reply)} if calls else {"content": str(reply)})

    def score(self, row, response):
        calls = parse_calls(response, row)
        ok = calls_match(calls, expected_calls(row), row)
        answer = json.dumps(sorted([[n, a] for n, a in calls], key=json.dumps), sort_keys=True)
        return {"score": 1.0 if ok else 0.0, "answer": answer}
