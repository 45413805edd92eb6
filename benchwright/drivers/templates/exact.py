"""task_impl.py written by Benchwright's builtin driver: normalised exact match of the reply against the reference.

Standard library only. CONFIG names the columns: ``input`` (the prompt) and ``reference``.
"""

import re
import string

CONFIG = {"input": "question", "reference": "answer"}
SYSTEM_PROMPT = "Answer with only the final answer, no explanation."

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation.replace(".", "").replace("-", ""))


def normalize(text):
    """Lowercase, drop punctuation, articles, thousands separators and a trailing period; collapse spaces."""
    text = str(text).strip().lower()
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = text.translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    text = " ".join(text.split())
    return text.rstrip(".").strip()


class Scorer:
    def extract(self, row):
        return str(row[CONFIG["input"]])

    def solve(self, row, call_sut):
        return call_sut([
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.extract(row)},
        ])

    def score(self, row, response):
        answer = normalize(response)
        return {"score": 1.0 if answer == normalize(row[CONFIG["reference"]]) else 0.0, "answer": answer}
