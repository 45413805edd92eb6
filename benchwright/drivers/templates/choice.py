"""task_impl.py written by Benchwright's builtin driver: multiple choice (MMLU / ARC style).

The choices come from one column (a list of strings, ARC's ``{"text": [...], "label": [...]}``, or a JSON string
of either) or from one column per letter (A, B, C, D...); the reference is a 0-based index, a letter, a label, or
the choice's text. The prompt lists the lettered choices; the letter is read from the reply robustly
("The answer is **B**.", "(B)", "B) ...", "Answer: b", or the text of exactly one choice). Standard library only.
CONFIG: ``input`` and ``reference`` columns, and either ``choices`` (one column) or ``letters`` (column per letter).
"""

import json
import re
import string

CONFIG = {"input": "question", "reference": "answer", "choices": "choices", "letters": []}
SYSTEM_PROMPT = "Answer the multiple-choice question. Reply with the letter of the correct choice."

_LETTERS = string.ascii_uppercase


def choices_of(row):
    """(texts, labels) of the row's choices; labels are the source's own (ARC) or None."""
    if CONFIG.get("letters"):
        return [str(row[c]) for c in CONFIG["letters"]], None
    value = row[CONFIG["choices"]]
    if isinstance(value, str) and value.strip()[:1] in "[{":
        value = json.loads(value)
    if isinstance(value, dict):
        texts = [str(t) for t in value.get("text", [])]
        labels = [str(x) for x in value.get("label", [])] or None
        return texts, labels
    if isinstance(value, list):
        return [str(t) for t in value], None
    raise TypeError(f"choices column {CONFIG['choices']!r} is neither a list nor a dict: {value!r}")


def reference_letter(row):
    """The reference as a letter."""
    texts, labels = choices_of(row)
    ref = row[CONFIG["reference"]]
    if isinstance(ref, bool):
        raise TypeError(f"reference {ref!r} is not a choice")
    if labels and str(ref).strip() in labels:
        return _LETTERS[labels.index(str(ref).strip())]
    if isinstance(ref, int) or (isinstance(ref, str) and ref.strip().isdigit()):
        index = int(ref)
        if 0 <= index < len(texts):
            return _LETTERS[index]
        raise ValueError(f"reference index {ref!r} is outside the {len(texts)} choices")
    text = str(ref).strip()
    if len(text) == 1 and text.upper() in _LETTERS[:len(texts)]:
        return text.upper()
    norm = [_norm(t) for t in texts]
    if _norm(text) in norm:
        return _LETTERS[norm.index(_norm(text))]
    raise ValueError(f"reference {ref!r} is neither an index, a letter nor one of the choices")


def _norm(text):
    return " ".join(re.sub(r"[^\w\s]", " ", str(text).lower()).split())


def extract_letter(reply, texts):
    """The letter the reply chooses among len(texts) choices, or None when it commits to none (or several)."""
    valid = _LETTERS[:len(texts)]
    text = str(reply or "").strip()
    bare = re.sub(r"[\s*_`'\"().:\[\]]", "", text)
    if len(bare) == 1 and bare.upper() in valid:
        return bare.upper()
    key = r"(?i:answer|option|choice)\s*(?i:is|would be|:)\s*[:\-]?\s*[*_(\[]*\s*"
    patterns = (
        key + r"([A-Z])\s*[*_)\]]*(?![A-Za-z])",  # "the answer is **B**", "final answer: (C)", "option is D because"
        # "Answer: b" (a lowercase letter only where it ends the phrase)
        key + r"([a-z])\s*[*_)\]]*(?=\s*(?:$|[.,;:!]))",
        r"^\s*[*_(\[]*([A-Z])[*_)\]]*\s*[).:\]-]",  # "B) ...", "B. ...", "(B) ...", "**B**: ..." at a line start
        r"\(([A-Z])\)",  # "(B)" anywhere
        r"\*\*([A-Z])\*\*",  # "**B**" anywhere
    )
    for pattern in patterns:
        found = {m.upper() for m in re.findall(pattern, text, re.MULTILINE)} & set(valid)
        if len(found) == 1:
            return found.pop()
    said = _norm(text)
    named = [i for i, t in enumerate(texts) if _norm(t) and re.search(r"\b" + re.escape(_norm(t)) + r"\b", said)]
    if len(named) == 1:
        return valid[named[0]]
    standalone = set(re.findall(r"(?<![A-Za-z'])([A-Z])(?![A-Za-z'])", text)) & set(valid) - {"I"}
    if len(standalone) == 1:
        return standalone.pop()
    return None


def render_prompt(row):
    texts, _ = choices_of(row)
    lines = [str(row[CONFIG["input"]]).strip(), ""]
    lines += [f"{_LETTERS[i]}. {t}" for i, t in enumerate(texts)]
    lines += ["", "Answer with the letter of the correct choice."]
    return "\n".join(lines)


class Scorer:
    def extract(self, row):
        return render_prompt(row)

    def solve(self, row, call_sut):
        return call_sut([
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.extract(row)},
        ])

    def score(self, row, response):
        texts, _ = choices_of(row)
        expected = reference_letter(row)
        answer = extract_letter(response, texts)
        return {"score": 1.0 if answer == expected else 0.0, "answer": answer, "reference": expected}
