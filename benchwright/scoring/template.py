"""The builtin driver's scorer template: normalized exact match (§7's three-method Scorer)."""

from __future__ import annotations

import hashlib

EXACT_MATCH = "template:normalized_exact_match"

_TEMPLATE = '''"""task_impl.py written by the builtin driver: normalized exact match of the reply against {reference!r}."""

import re
import string

INPUT_FIELD = {input!r}
REFERENCE_FIELD = {reference!r}
SYSTEM_PROMPT = "Answer with only the final answer, no explanation."

_ARTICLES = re.compile(r"\\b(a|an|the)\\b")
_PUNCT = str.maketrans("", "", string.punctuation.replace(".", "").replace("-", ""))


def normalize(text):
    """Lowercase, drop punctuation, articles, thousands separators and a trailing period; collapse spaces."""
    text = str(text).strip().lower()
    text = re.sub(r"(?<=\\d),(?=\\d{{3}}\\b)", "", text)
    text = text.translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    text = " ".join(text.split())
    return text.rstrip(".").strip()


class Scorer:
    def extract(self, row):
        return str(row[INPUT_FIELD])

    def solve(self, row, call_sut):
        return call_sut([
            {{"role": "system", "content": SYSTEM_PROMPT}},
            {{"role": "user", "content": self.extract(row)}},
        ])

    def score(self, row, response):
        return 1.0 if normalize(response) == normalize(row[REFERENCE_FIELD]) else 0.0
'''


def render_exact_match(*, input_field: str, reference_field: str) -> str:
    """The source of task_impl.py for a dataset whose input and reference columns are known."""
    return _TEMPLATE.format(input=input_field, reference=reference_field)


def impl_sha256(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()
