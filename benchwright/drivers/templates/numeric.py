"""task_impl.py written by Benchwright's builtin driver: numeric final answer (GSM8K style).

The reference is a number, or a worked solution ending ``#### <number>``. The answer is taken from the reply by,
in order: the last ``#### <number>``, the last ``\\boxed{...}``, the last "the answer is <number>" / "answer: <number>",
else the last number in the reply (so "42, no wait, 41" is 41). Numbers compare exactly as fractions: ``1,234``,
``1234.0`` and ``$1,234`` are equal. Standard library only; CONFIG names the ``input`` and ``reference`` columns.
"""

import re
from fractions import Fraction

CONFIG = {"input": "question", "reference": "answer"}
SYSTEM_PROMPT = ("Solve the problem step by step. End your reply with the final numeric answer on its own line, "
                 "written as '#### <number>'.")

_NUMBER = r"[-\u2212]?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s?/\s?\d+)?|[-\u2212]?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_HASHES = re.compile(r"####\s*(" + _NUMBER + ")")
_ANSWER_IS = re.compile(r"(?:answer|result)\s*(?:is|=|:)?\s*[:=]?\s*\**\s*(" + _NUMBER + ")", re.IGNORECASE)
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")


def parse_number(text):
    """The number ``text`` spells (commas, $, a fraction a/b, a unicode minus allowed), or None."""
    if text is None:
        return None
    cleaned = str(text).strip().replace("\u2212", "-").replace("$", "").replace(",", "").replace(" ", "")
    cleaned = cleaned.rstrip(".").rstrip("%")
    try:
        if "/" in cleaned:
            num, den = cleaned.split("/", 1)
            return Fraction(num) / Fraction(den)
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def _boxed(text):
    """Contents of every \\boxed{...}, braces balanced."""
    out, start = [], 0
    while (i := text.find("\\boxed{", start)) != -1:
        depth, j = 1, i + len("\\boxed{")
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        out.append(text[i + len("\\boxed{"):j - 1])
        start = j
    return out


def extract_answer(reply):
    """The final numeric answer in a free-text reply, as a Fraction, or None."""
    text = str(reply or "")
    found = _HASHES.findall(text)
    if found:
        return parse_number(found[-1])
    for inner in reversed(_boxed(text)):
        inner = _FRAC.sub(lambda m: f"{m.group(1)}/{m.group(2)}", inner).replace("{", "").replace("}", "")
        value = parse_number(inner)
        if value is None:
            numbers = _NUMBER_RE.findall(inner)
            value = parse_number(numbers[-1]) if numbers else None
        if value is not None:
            return value
    found = _ANSWER_IS.findall(text)
    if found:
        return parse_number(found[-1])
    numbers = _NUMBER_RE.findall(text)
    return parse_number(numbers[-1]) if numbers else None


def reference_number(reference):
    """The reference's number: after its last '####' when it has one, else the whole value (else its last number)."""
    text = str(reference)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    value = parse_number(text)
    if value is None:
        numbers = _NUMBER_RE.findall(text)
        value = parse_number(numbers[-1]) if numbers else None
    return value


def spell(value):
    """A canonical spelling of a number (the meta 'answer', so majority_on groups equal answers)."""
    if value is None:
        return None
    if value.denominator == 1:
        return str(value.numerator)
    as_float = float(value)
    return repr(as_float) if Fraction(as_float) == value else f"{value.numerator}/{value.denominator}"


class Scorer:
    def extract(self, row):
        return str(row[CONFIG["input"]])

    def solve(self, row, call_sut):
        return call_sut([
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.extract(row)},
        ])

    def score(self, row, response):
        expected = reference_number(row[CONFIG["reference"]])
        if expected is None:
            raise ValueError(f"reference {row[CONFIG['reference']]!r} holds no number")
        answer = extract_answer(response)
        return {"score": 1.0 if answer is not None and answer == expected else 0.0, "answer": spell(answer),
                "reference": spell(expected)}
