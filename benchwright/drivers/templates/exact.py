"""task_impl.py written by Benchwright's builtin driver: short free-text answers (TriviaQA / Natural Questions style).

The answer is read from the reply's answer part (a reasoning block skipped; after a self-correction, the corrected
part first) by the first rule that finds one: the last ``\\boxed{...}``, a JSON ``{"answer": ...}``, the last
"Final answer: X" / "The answer is X" (to the end of its sentence), a "Final answer" heading's next line, the whole
reply when it is one short line, the one **bold** phrase, the subject-restating sentence's tail ("The capital of
Australia is Canberra."), else the reply's first sentence. It matches when it equals the reference after
normalising (lowercase; punctuation, articles, markup, thousands separators and a trailing period dropped).
Standard library only. CONFIG names the columns: ``input`` (the prompt) and ``reference``.
"""

import re
import string

from benchwright.drivers.templates._reply import (  # inlined by render()
    after_correction,
    answer_part,
    boxed,
    json_answers,
    unlatex,
)

CONFIG = {"input": "question", "reference": "answer"}
SYSTEM_PROMPT = "Answer with only the final answer, no explanation."

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation.replace(".", "").replace("-", ""))
_ANSWER_IS = re.compile(r"(?i:\b(?:final answer|answer)\b)\**\s*(?:(?i:is|would be)\s*:?|:)\**\s*(.+?)\s*"
                        r"(?:$|(?<=[^\s.])\.(?:\s|$))", re.MULTILINE)
_HEADING = re.compile(r"^[#*_\s]*(?:final answer|answer)[#*_:\s]*$", re.IGNORECASE | re.MULTILINE)
# The tail after a sentence's last "is/was/by/...": "Pride and Prejudice was written by Jane Austen." -> Jane Austen
_RESTATED = re.compile(r"^.*\b(?:is|was|are|were|by|called|named|it's|year)\s+(?!(?:not|known|also)\b)(.+)$",
                       re.IGNORECASE)
_ASIDE = re.compile(r"\s*\([^()]*\)\s*$")


def normalize(text):
    """Lowercase, drop punctuation, articles, thousands separators and a trailing period; collapse spaces."""
    text = unlatex(str(text)).strip().lower()
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = text.translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    text = " ".join(text.split())
    return text.rstrip(".").strip()


def find_answer(reply):
    """(answer, rule): the reply's answer as written (None when it gives none) and the rule that found it."""
    text = answer_part(reply)
    if not text.strip():
        return None, None
    tail = after_correction(text)
    if tail is not None:
        answer, rule = _find(tail)
        if answer is not None:
            return answer, rule
    return _find(text)


def _first_sentence(text):
    line = next((x for x in text.splitlines() if x.strip()), "")
    first = re.split(r"(?<=[^\s.A-Z])[.!?](?:\s|$)|\s[\u2014\u2013-]\s|;\s", line.strip(), maxsplit=1)[0]
    return _ASIDE.sub("", first).strip().rstrip(".!")  # "Au (from the Latin aurum)." -> Au


def _find(text):
    for inner in reversed(boxed(text)):  # \boxed{\text{Canberra}}
        if normalize(inner):
            return unlatex(inner).strip(), "boxed"
    for item in reversed(json_answers(text)):  # {"answer": "Canberra"}
        if normalize(item):
            return str(item), "json"
    said = [m.group(1) for m in _ANSWER_IS.finditer(text) if normalize(m.group(1))]
    if said:  # "**Final answer:** Canberra", "The answer is Canberra." (the last one said)
        return said[-1], "answer_phrase"
    for heading in reversed(list(_HEADING.finditer(text))):  # "## Answer\n\nCanberra"
        below = [line for line in text[heading.end():].splitlines() if line.strip()]
        if below:
            return below[0], "final_line"
    lines = [line for line in text.splitlines() if line.strip()]
    first = _first_sentence(text)
    whole = _ASIDE.sub("", lines[0]).strip().rstrip(".!")
    if len(lines) == 1 and whole == first and len(whole.split()) <= 8 and not _RESTATED.search(whole):
        # "Canberra", "canberra.", "**Jane Austen**"
        bold = re.fullmatch(r"\s*\*\*(.+?)\*\*[.!]?\s*", whole)
        return (bold.group(1) if bold else whole), "whole"
    emphasised = set(re.findall(r"\*\*([^*\n]+?)\*\*", text))
    if len(emphasised) == 1:  # "The capital of Australia is **Canberra**, not Sydney."
        return emphasised.pop(), "bold"
    restated = _RESTATED.search(first)
    if restated and len(restated.group(1).split()) <= 6:  # "The capital of Australia is Canberra."
        return restated.group(1), "restated"
    if normalize(first):  # "Canberra. It replaced Melbourne as the seat of government in 1927."
        return first, "first_sentence"
    return None, None


class Scorer:
    def extract(self, row):
        return str(row[CONFIG["input"]])

    def one_call(self, row):
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.extract(row)},
        ]

    def solve(self, row, call_sut):
        return call_sut(self.one_call(row))

    def score(self, row, response):
        found, rule = find_answer(response)
        answer = None if found is None else normalize(found)
        return {"score": 1.0 if answer is not None and answer == normalize(row[CONFIG["reference"]]) else 0.0,
                "answer": answer, "extracted": answer is not None, "rule": rule}
