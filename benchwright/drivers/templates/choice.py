"""task_impl.py written by Benchwright's builtin driver: multiple choice (MMLU / ARC style).

The choices come from one column (a list of strings, ARC's ``{"text": [...], "label": [...]}``, or a JSON string of
either) or from one column per letter (A, B, C, D...); the reference is a 0-based index, a letter, a label, or the
choice's text. The prompt lists the lettered choices; the letter is read from the reply's answer part (a reasoning block
skipped; only the last ``<answer>...</answer>`` element when it has one; a self-correction's corrected part first) by
the first rule that finds one: a JSON ``{"answer": "C"}``, ``\\boxed{C}``, the whole reply a letter, a "Final answer"
heading's next line, an answer phrase ("The answer is **B**", "Answer: b", "I'd go with C", "So C.", "That leaves C.",
"That leaves (B) Jupiter.", "B is correct.", the last one said), the options reviewed one by one with one ticked ("| B |
\u2705 |", "- B: \u2705", "A. No" then "B. Yes", "### Option B: Jupiter" then "\u2705 Correct"), "B) ..." opening the
reply, one "(B)"/"**B**", the one letter of the last clause ("Although C ..., B is ...", "Between B and C, B is ..."),
an answer phrase followed by a choice's whole text ("Answer: 2", "The answer is Paris."), the whole text of exactly one
choice the reply does not deny ("not Saturn", "Saturn? No.", "Many people think Saturn") or set aside ("Although Saturn
...,"; a choice of 3 characters or fewer only as the whole reply; a Latin letter's accents aside), one lone capital
letter in a short reply that does not deny or doubt. An explicit letter always wins over a choice's text. Standard
library only.
CONFIG: ``input`` and ``reference`` columns, and either ``choices`` (one column) or ``letters`` (column per letter).
"""

import json
import re
import string

from benchwright.drivers.templates._reply import (  # inlined by render()
    after_correction,
    answer_part,
    boxed,
    fold_accents,
    json_answers,
    plain_apostrophes,
    unlatex,
)

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
    return " ".join(re.sub(r"[^\w\s]", " ", fold_accents(str(text).casefold())).split())


def extract_letter(reply, texts, question=None):
    """The letter the reply chooses among len(texts) choices, or None when it commits to none (or several)."""
    return find_letter(reply, texts, question)[0]


def find_letter(reply, texts, question=None):
    """(letter, rule) for the reply's choice: (None, None) when it commits to none. Only the answer part is read
    (a reasoning block is skipped); after a self-correction ("A... wait, actually C") the corrected part wins."""
    text = plain_apostrophes(answer_part(reply, tags=True))
    if not text.strip():
        return None, None
    tail = after_correction(text)
    if tail is not None:
        letter, rule = _find(tail, texts, question)
        if letter is not None:
            return letter, rule
    return _find(text, texts, question)


_KEY = (r"(?i:\b(?:answer|option(?<!each option)(?<!every option)|choice(?<!each choice)(?<!every choice))\b"
        r"(?:\s+(?:is|would be|should be|must be)\s*:?|\s*:)"
        r"|\b(?:I(?:'d| would| will)? (?:go with|choose|pick|select|say)|(?:it|that)(?:'s| is| must be| would be)"
        r"|correct (?:one|option|choice|letter) is)\b)")
# After the key phrase: markup, "option"/"letter", then the letter; a lowercase letter only where it ends the phrase
# ("Answer: b", "answer is c) berlin"), so "the answer is a bit unclear" is no answer.
_AFTER = r"\s*[*_(\[$]*\s*(?:(?i:option|choice|letter)\s*)?[*_(\[]*\s*"
_KEY_LETTER = re.compile(_KEY + _AFTER + r"(?:([A-Z])(?![A-Za-z0-9'])"
                         r"|([a-z])(?=[*_)\]]*(?:[.):](?:\s|$)|\s*(?:$|[,;!]))))", re.MULTILINE)
# A line that ends the reply's reasoning with its letter: "So C.", "Therefore, **B**", "Thus: (D)", after an
# elimination "That leaves C." The letter ends the line, so "so A is wrong" is no answer.
_CONCLUDING = re.compile(r"\b(?i:so|thus|hence|therefore|(?:that|which|this) leaves(?: (?:us with|only))?|"
                         r"leaving(?: only)?)\b[,:]?\s*[*_(\[]*\s*(?:(?i:option|choice|letter)\s*)?[*_(\[]*"
                         r"([A-Z])[*_)\]]*[.!]?[*_]*[ \t]*$", re.MULTILINE)
# An elimination's end with the letter's own text after it, or "only B fits": "That leaves (B) Jupiter.", "Among A, B,
# C and D, only B fits." (the text is checked to be the letter's own choice: "That leaves A and B." is no answer).
_LEAVES = re.compile(r"\b(?i:(?:that|which|this) leaves(?: (?:us with|only))?|leaving(?: only)?|only)\s+[*_(\[]*"
                     r"([A-Z])[*_)\]]*[).:]?\s*([^\n]{0,300}?)[.!]*[*_]*[ \t]*$", re.MULTILINE)
# The letter said to be right: "B is correct.", "**B** is the right answer", "(C) is the best choice", a lower-case one
# in brackets after "option" ("option (b) is right"); not "neither A nor C is correct", "if A is correct".
_LETTER_IS = re.compile(r"(?<![A-Za-z'])(?<!(?i:nor|not) )(?<!(?i:if) )(?<!(?i:neither|whether) )"
                        r"(?:[*_(\[]*([A-Z])|(?i:option|choice)\s+[*_]*\(([a-z])\))[*_)\]]*\s+is\s+"
                        r"(?:(?:the\s+)?(?:correct|right|best)"
                        r"(?:\s+(?:answer|choice|option|one))?|the\s+answer)\b")
# The options reviewed one by one, each with a verdict, one ticked: a table ("| B | \u2705 |", "| B) Carbon dioxide |
# \u2714 Correct |"), a list ("- B: \u2705", "**B) 1**: no root mod 3 \u2705", "A. No\nB. Yes") or sentences ("A: no. B:
# yes."). An option opens its line or follows a sentence's end; its verdict is a tick or a cross anywhere after it, or
# a word right after it or after its text and a dash or colon ("B. Yes", "| B | Correct |", "B) Jupiter \u2013 yes") or
# ending it ("... so B is right" is letter_pattern's).
_OPTION_ITEMS = re.compile(r"(?<=[.;!])\s+(?=[*_(\[]*[A-Z][*_)\]]*\s*[).:]\s)")
_OPTION_HEAD = re.compile(r"^[ \t]*(?:\|[ \t]*|[-*+\u2022][ \t]+|#{1,6}[ \t]+)?[*_]*(?:(?i:option|choice)[ \t]+)?"
                          r"[*_(\[]*([A-Z])[*_)\]]*[ \t]*(?:[).:\u2014\u2013-]|(?=\|)|(?=[*_]*[ \t]*$))")
_TICKED = re.compile(r"[\u2705\u2714\u2713\u2611]")
_CROSSED = re.compile(r"[\u274c\u2717\u2718\u2716\u274e\U0001f6ab]")
_WORD_VERDICT = re.compile(r"^[\W_]*(?i:(?:this|it|that)(?:'s|\s+is)\s+)?"
                           r"(?i:(yes|correct|right|true)|(no|incorrect|wrong|false))"
                           r"(?:[\W_]*$|[\s*_]*[,.;:(|\u2014\u2013-]|\s+(?i:because|since|as)\b)")
_ANY_VERDICT = re.compile(r"[\u2705\u2714\u2713\u2611\u274c\u2717\u2718\u2716\u274e\U0001f6ab]"
                          r"|(?i:\b(?:yes|no|correct|incorrect|right|wrong|true|false)\b)")  # before looking closer
_LAST_WORD_VERDICT = re.compile(r"(?<!not )(?<!n't )\b(?i:(correct|right)|(incorrect|wrong))[\W_]*$")
# An answer phrase and what follows it to the end of its sentence or line, read as a choice's whole text.
_ANSWER_VALUE = re.compile(r"(?i:\b(?:final answer|correct answer|answer)\b)[*_]*(?:\s+(?:is|would be)\s*:?|\s*:)[*_]*"
                           r"\s*([^\n]{1,300}?)\s*(?:[.!](?:\s|$)|$)", re.MULTILINE)
_FINAL_HEADING = re.compile(r"^[#*_\s]*(?:final answer|answer|correct answer)[#*_:\s]*$", re.IGNORECASE | re.MULTILINE)


def _letter_in(value, texts):
    """The letter ``value`` names: a letter with markup ("(C)", "C.", "C: 1/C"), else a choice's whole text."""
    valid = _LETTERS[:len(texts)]
    value = unlatex(value).strip()
    bare = re.sub(r"[\s*_`'\"().:\[\]$]", "", value)
    if len(bare) == 1 and bare.upper() in valid:
        return bare.upper()
    lead = re.match(r"^[*_(\[\s]*([A-Za-z])[*_)\]]*\s*[).:\]-]\s", value + " ")
    if lead and lead.group(1).upper() in valid:
        return lead.group(1).upper()
    norm = [_norm(t) for t in texts]
    return valid[norm.index(_norm(value))] if _norm(value) and norm.count(_norm(value)) == 1 else None


def _find(text, texts, question=None):
    valid = _LETTERS[:len(texts)]
    for value in reversed(json_answers(text)):  # {"answer": "C"}
        letter = _letter_in(str(value), texts)
        if letter is not None:
            return letter, "json"
    for inner in reversed(boxed(text)):  # \boxed{C}, \boxed{\text{(C) 1/C}}
        letter = _letter_in(inner, texts)
        if letter is not None:
            return letter, "boxed"
    bare = re.sub(r"[\s*_`'\"().:\[\]$]", "", text)
    if len(bare) == 1 and bare.isalpha() and bare.upper() in valid:  # the whole reply: "C", "**C**", "(c)."
        return bare.upper(), "bare_letter"
    for heading in reversed(list(_FINAL_HEADING.finditer(text))):  # "## Final answer\n\n**C**"
        below = [line for line in text[heading.end():].splitlines() if line.strip()]
        letter = _letter_in(below[0], texts) if below else None
        if letter is not None:
            return letter, "final_line"
    spoken = sorted([(m.start(), m.group(1) or m.group(2).upper()) for m in _KEY_LETTER.finditer(text)]
                    + [(m.start(), m.group(1)) for m in _CONCLUDING.finditer(text)]
                    + [(m.start(), m.group(1) or m.group(2).upper()) for m in _LETTER_IS.finditer(text)]
                    + [(m.start(), m.group(1)) for m in _LEAVES.finditer(text) if _leaves(m, texts)])
    said = [x for _, x in spoken if x in valid]
    if said:  # "The answer is **B**", "Answer: b", "I'd go with C", "it's B: ...", "So C.", "B is correct."
        return said[-1], "letter_pattern"
    letter = _ticked_option(text, texts)
    if letter is not None:  # "| B | \u2705 |", "- B: \u2705", "A. No\nB. Yes": the options reviewed, one ticked
        return letter, "verdicts"
    marker = r"^\s*[*_(\[]*([A-Z])[*_)\]]*\s*[).:\]-]"
    first = next((line for line in text.splitlines() if line.strip()), "")
    lead = re.match(marker, first)  # "B) London", "**C.** 1/C" on line 1 (not a list of the options, one a line)
    if lead and lead.group(1) in valid and set(re.findall(marker, text, re.MULTILINE)) & set(valid) == {lead.group(1)}:
        return lead.group(1), "letter_pattern"
    for pattern in (r"\(([A-Z])\)", r"\*\*([A-Z])\*\*"):  # one "(B)" or "**B**" anywhere
        found = set(re.findall(pattern, text)) & set(valid)
        if len(found) == 1:
            return found.pop(), "letter_pattern"
    letter = _last_clause_letter(text, texts)
    if letter is not None:  # "Although Saturn (C) has rings, the largest is Jupiter (B).", "..., but B is larger."
        return letter, "letter_pattern"
    for value in reversed(_ANSWER_VALUE.findall(text)):  # "Answer: 2", "The answer is Paris." (a choice's text)
        letter = _letter_in(value.strip(" *_"), texts)
        if letter is not None:
            return letter, "choice_text"
    named = _named_choices(text, texts, question)
    if len(named) == 1:  # exactly one choice's whole text: "The capital is Madrid." (a short one, "is" or "1",
        return valid[named[0]], "choice_text"  # only as the whole reply: prose is full of them), not denied
    # A short reply naming one letter: "Option D", "I'd say B, London", past the letters it denies or sets aside
    # ("B, not C.", "Not B. C.", "B (though C is close)."); not one that denies or doubts otherwise ("Only A is
    # wrong.", "Although B looks tempting, it isn't right.").
    kept = _SET_ASIDE.sub(" ", text) if len(text.split()) <= 20 else ""
    if kept and not _DOUBT.search(kept):
        lone = set(re.findall(r"(?<![A-Za-z'])([A-Z])(?![A-Za-z'])", kept)) & set(valid) - {"I"}
        if len(lone) == 1:
            return lone.pop(), "lone_letter"
    return None, None


_DENIES = re.compile(r"(?i)\b(?:not(?! only)|no(?! doubt| question)|nope|never|neither|nor|wrong|incorrect|false|"
                     r"rule[sd]? out|eliminat\w*|(?:people|many|some|most|you) (?:might |may |would |often )?"
                     r"(?:think|assume|believe|guess|say))\b|n't\b")
_ASKED_AND_DENIED = re.compile(r"(?i)(?:^|(?<=[.!?\n]))([^.!?\n]*)\?\s*(?=(?:no|nope|not)\b)")  # "Saturn? No."
_CLAUSES = re.compile(r"[.!?;:\u2014\u2013]+(?=\s|$)|\s-+\s|,|\n")
# A clause that ranks its choices after the answer: "..., followed by Saturn.", "..., well ahead of Saturn."
_RANKED_AFTER = re.compile(r"(?i)(?:and\s+)?(?:(?:well|far|just|closely)\s+)?"
                           r"(?:followed\s+(?:closely\s+)?by|ahead\s+of)\b")
_ASIDE_OPENING = re.compile(r"(?i)^(?:although|though|even though|while|whilst|whereas)\b")


def _named_choices(text, texts, question=None):
    """The choices whose whole text the reply names and does not deny. A clause that denies ("not Saturn", "Saturn
    isn't it", "I don't think it's Saturn", "Many people think Saturn") takes its choices out, and so does one that
    opens on "but" and denies what the question asks without naming one ("C is Saturn, but it is not the largest.";
    not "Jupiter is the largest, but not the densest.") and a question denied next ("Saturn? No."); an opening
    "Although/While ..." clause's choices are set beside the answer, not given as it, and so are those a clause ranks
    after it ("Jupiter is the largest, followed by Saturn."). A first sentence that is one choice's text alone is the
    answer ("Jupiter. Saturn is the second largest."). A short choice ("is", "1") counts only as the whole reply."""
    said_text = _norm(text)
    named = {i for i, t in enumerate(texts) if _norm(t) and (
        re.search(r"\b" + re.escape(_norm(t)) + r"\b", said_text) if len(_norm(t)) > 3 else _norm(t) == said_text)}
    if len(named) < 2 and not _DENIES.search(text):
        return sorted(named)
    marked = text  # each named choice's text as a mark of its own, so that its words are not read as the clause's
    for i in sorted(named, key=lambda i: -len(texts[i])):
        words = re.escape(str(texts[i]).strip().rstrip(".!?")).replace("\\ ", r"\s+")
        if len(_norm(texts[i])) > 3:
            marked = re.sub(r"(?<!\w)" + words + r"(?!\w)", f"\x00{i}\x00", marked, flags=re.IGNORECASE)

    def marks(part):
        return {int(i) for i in re.findall(r"\x00(\d+)\x00", part)}

    denied = {i for asked in _ASKED_AND_DENIED.findall(marked) for i in marks(asked)}
    before = set()  # type: set[int]
    for clause in _CLAUSES.split(marked):
        here, clause = marks(clause), clause.strip()
        if _DENIES.search(clause):  # "..., but it is not the largest" denies what the question asks, "..., but not
            asked = question is None or bool(_words(clause) & (_words(question) | _VERDICT_WORDS))  # the densest" ...
            denied |= here or (before if re.match(r"(?i)but\b", clause) and asked else set())
        elif _ASIDE_OPENING.match(clause) or _RANKED_AFTER.match(clause):
            denied |= here
        before = here or before  # "but it ..." is the last choice named
    first = re.match(r"\s*([^.!?\n]+)[.!]\s", text + " ")
    bare = [i for i in named - denied if first and _norm(texts[i]) == _norm(first.group(1))]
    if len(bare) == 1:  # "Jupiter. Saturn is the second largest."
        return bare
    return sorted(named - denied)


def _words(text):
    """The words of ``text`` of four letters or more, lower-cased: what tells a clause about the question's subject."""
    return set(re.findall(r"[a-z]{4,}", str(text).lower()))


# What a clause says of the answer whatever the question: "..., but it isn't right."
_VERDICT_WORDS = frozenset(("answer", "correct", "right", "choice", "option", "true", "best"))
_SET_ASIDE = re.compile(r"(?i:\bnot)\s+[*_(\[]*[A-Z](?![A-Za-z'])[*_)\]]*|\((?=[^()]*[a-z]{2})[^()]*\)")
_DOUBT = re.compile(r"(?i)\b(?:not|wrong|incorrect|false|unsure|doubt|double-check)\b|n't\b")


def _leaves(match, texts):
    """Whether a ``_LEAVES`` match says its letter alone: nothing after it but its choice's text or "fits"."""
    after, index = _norm(match.group(2)), _LETTERS.find(match.group(1))
    return (not after or after in ("fits", "works", "remains", "is left", "is correct", "is right", "fits best")
            or (index < len(texts) and after == _norm(texts[index])))


def _last_clause_letter(text, texts):
    """The one letter in the reply's last clause when the reply names several: the last sentence's part after its
    last "but", or after an opening "Although/While ...," clause ("Although Saturn (C) has rings, the largest planet
    is Jupiter (B).", "C is Saturn, which is large, but B (Jupiter) is the largest."), else None. The choices' own
    texts are read past ("None of the above", "True, False", a sentence of their own)."""
    valid = _LETTERS[:len(texts)]
    for choice in sorted((str(t).strip() for t in texts if len(str(t).strip()) > 1), key=len, reverse=True):
        text = re.sub(r"(?<!\w)" + re.escape(choice) + r"(?!\w)", " ", text, flags=re.IGNORECASE)
    last = re.split(r"(?<=[.!?])\s+", text.strip())[-1]
    clause = re.split(r"(?i),?\s+but\s+", last)[-1]
    if clause == last:
        opening = re.match(r"(?i)(?:although|though|even though|while|whilst|whereas|between|of|among|out of|"
                           r"comparing)\b[^,]{1,120},\s*(.+)$", last)
        clause = opening.group(1) if opening else None
    if clause is None or re.search(r"(?i)\b(?:not|no|neither|none|nor|wrong|incorrect|false|isn't|aren't|unlikely)\b"
                                   r"|n't\b", clause):
        return None  # "A is close, but B is wrong."
    found = set(re.findall(r"(?<![A-Za-z'])([A-Z])(?![A-Za-z'])", clause)) & set(valid) - {"I"}
    return found.pop() if len(found) == 1 else None


def _ticked_option(text, texts):
    """The one option a review of the options ticks (``_OPTION_HEAD``), or None: none or several ticked. A word
    right after an option that is its own choice's text ("A. Yes" for a choice "Yes") is the option listed, no
    verdict."""
    if _ANY_VERDICT.search(text) is None:
        return None
    valid = _LETTERS[:len(texts)]
    ticked, crossed = set(), set()  # type: set[str], set[str]
    pending = None  # an option's heading line with no verdict on it: its verdict opens the next line
    for line in text.splitlines():
        if pending and line.strip() and _OPTION_HEAD.match(line) is None:
            word = _TICKED.match(line.strip()) or _CROSSED.match(line.strip()) or _WORD_VERDICT.match(line)
            if word is not None:  # "### Option B: Jupiter" then "\u2705 Correct \u2014 it is the largest."
                tick = _TICKED.match(line.strip()) or (word.re is _WORD_VERDICT and word.group(1))
                (ticked if tick else crossed).add(pending)
        pending = None if line.strip() else pending
        for item in _OPTION_ITEMS.split(line):
            head = _OPTION_HEAD.match(item)
            if head is None or head.group(1) not in valid:
                continue
            pending = head.group(1)
            rest = item[head.end():]
            tick = _TICKED.search(rest)
            if tick or _CROSSED.search(rest):  # a mark says it, whatever the words ("True, False ❌")
                (ticked if tick else crossed).add(head.group(1))
                pending = None
                continue
            own = str(texts[valid.index(head.group(1))]).strip()
            said = re.match(r"[\s*_]*" + re.escape(own) + r"[\s*_]*(?=[\u2014\u2013:|(-])", rest, re.I) if own else None
            rest = rest[said.end():] if said else rest  # "B) Jupiter \u2013 yes": the verdict after the option's text
            word = _WORD_VERDICT.match(rest) or _LAST_WORD_VERDICT.search(rest)
            if word is not None and (said or _norm(rest) != _norm(own)):
                (ticked if word.group(1) else crossed).add(head.group(1))
                pending = None
    return ticked.pop() if len(ticked) == 1 and not ticked & crossed else None


def render_prompt(row):
    texts, _ = choices_of(row)
    lines = [str(row[CONFIG["input"]]).strip(), ""]
    lines += [f"{_LETTERS[i]}. {t}" for i, t in enumerate(texts)]
    lines += ["", "Answer with the letter of the correct choice."]
    return "\n".join(lines)


class Scorer:
    def extract(self, row):
        return render_prompt(row)

    def one_call(self, row):
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.extract(row)},
        ]

    def solve(self, row, call_sut):
        return call_sut(self.one_call(row))

    def score(self, row, response):
        texts, _ = choices_of(row)
        expected = reference_letter(row)
        answer, rule = find_letter(response, texts, str(row[CONFIG["input"]]))
        return {"score": 1.0 if answer == expected else 0.0, "answer": answer, "reference": expected,
                "extracted": answer is not None, "rule": rule}
