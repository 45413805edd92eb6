"""Shared by the builtin scorer templates that compare free text (``exact.py``): the forms a dataset gives its reference
answer in, read as the list of texts any of which is right.

Standard library only; inlined by :func:`benchwright.drivers.templates.render` like ``_reply.py`` (from its first
``import`` on), so the rendered task_impl.py stays one standalone file.
"""

import json

# A reference's keys that hold its accepted texts, most specific first: TriviaQA's answer object ("aliases", and its
# "value"), SQuAD's answers ("text": a list), a plain {"answer": ...}.
_TEXT_KEYS = ("aliases", "normalized_aliases", "value", "text", "answer", "answers", "normalized_value")


def reference_texts(value):
    """Every text ``value`` accepts: a string is one (a JSON list or object in it is read as such, as a CSV gives it);
    a list gives each of its texts (Natural Questions' answers); an object gives what its known keys hold (TriviaQA's
    ``{"value", "aliases", ...}``, SQuAD's ``{"text": [...], "answer_start": [...]}``); anything else its ``str()``.
    At most 100 texts are read (and 10,000 items looked at); none repeats."""
    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):
        try:
            value = json.loads(value)
        except ValueError:
            pass
    texts, stack, steps = [], [value], 0  # type: list[str], list[object], int
    while stack and len(texts) < 100 and steps < 10_000:  # a nest of empty lists is read no further either
        item, steps = stack.pop(0), steps + 1
        if isinstance(item, dict):
            stack[:0] = [item[key] for key in _TEXT_KEYS if key in item]
        elif isinstance(item, (list, tuple)):
            stack[:0] = list(item)[:100]
        elif item is not None and str(item) not in texts:
            texts.append(str(item))
    return texts or [str(value)]
