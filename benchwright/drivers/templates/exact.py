"""task_impl.py written by Benchwright's builtin driver: short free-text answers (TriviaQA / Natural Questions style).

The answer is read from the reply's answer part (a reasoning block skipped; only the last ``<answer>...</answer>``
element when it has one; after a self-correction, the corrected part first) by the first rule that finds one: the last
``\\boxed{...}``, a JSON ``{"answer": ...}``, the last "Final answer: X" / "The answer is X" (to the end of its
sentence; "Final Answer: The final answer is X." too), a "Final answer" heading's next line, a line whose label restates
the question ("- **Capital:** Canberra", "Australia \u2192 Canberra", "Capital of Australia = Canberra"), a markdown
table's first row (its cell that does not restate the question), a fact sheet's first label line ("- **Author:** Jane
Austen"), a denial and its correction ("It's not Sydney, it's Canberra."), the whole reply when it is one short line,
the one **bold** phrase, the part of the first sentence that does not restate the question ("The capital of Australia is
Canberra.", "Canberra is the capital of Australia.", in the clause after a "but" when it has one), the one name a short
sentence gives besides the question's own ("In Brazil, people speak Portuguese."), else the reply's first sentence. A
chat model's opening pleasantry ("Sure!", "Hmm, let me think.") and a short reply's lead-in ("I'd say") are skipped, and
an answer loses a qualifier that restates the question ("Canberra, Australia"). It matches when it equals the reference
after normalising (lowercase; punctuation, articles, markup, emoji, arrows, accents, thousands separators and a trailing
period dropped; a count spelled out as its digits), a year also by a date in it ("November 9, 1989"), a name also after
its description, beside words of the question, as the owner of a work a "Who ...?" question asks about ("Jane Austen's
novel") or glossing a symbol ("H (hydrogen)").
Standard library only. CONFIG names the columns: ``input`` (the prompt) and ``reference``.
"""

import functools
import re
import string
import unicodedata

from benchwright.drivers.templates._counts import (  # inlined by render()
    _COUNT_FIRST,
    _COUNT_NOUN,
    _COUNT_WORDS,
    _COUNTED,
    _DATE_OF_YEAR,
    _HOW_MANY,
    _NUMBER_WORD,
    _NUMBER_WORDS,
)
from benchwright.drivers.templates._names import (  # inlined by render()
    _DETERMINERS,
    _GLOSSED,
    _NAME,
    _NATIONALITY,
    _NO_SUBJECT,
    _NOT_A_NAME,
    _NOT_DESCRIPTOR,
    _PLACE_OF,
    _POSSESSIVE,
    _PRONOUN,
    _ROLE,
    _TITLES,
    _WHERE_TAIL,
    _WHO,
    _WHO_SAYS,
    _WORK,
)
from benchwright.drivers.templates._reference import reference_texts  # inlined by render()
from benchwright.drivers.templates._reply import (  # inlined by render()
    after_correction,
    answer_part,
    boxed,
    fold_accents,
    json_answers,
    plain_apostrophes,
    unlatex,
)

CONFIG = {"input": "question", "reference": "answer"}
SYSTEM_PROMPT = "Answer with only the final answer, no explanation."

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ARROWS = re.compile(r"[\u2190-\u21ff\u27f0-\u27ff\u2900-\u297f]")
_PUNCT = str.maketrans("", "", string.punctuation.replace(".", "").replace("-", ""))
# "The answer is Canberra.", "**Final answer:** Canberra", "Answer \u2014 Canberra"; not a "Longer answer: the city..."
# that opens an explanation.
_ANSWER_IS = re.compile(r"(?i:(?<!long )(?<!longer )(?<!detailed )(?<!full )\b(?:final answer|answer)\b)\**\s*"
                        r"(?:(?i:is|would be)\s*:?|:|[\u2014\u2013]|-(?=\s))\**\s*(.+?)\s*"
                        r"(?:$|(?<=[^\s.])\.(?:\s|$))", re.MULTILINE)
# The answer phrase said twice, as lm-eval's Minerva prompt has models answer: "Final Answer: The final answer is X. I
# hope it is correct."
_SAID_AGAIN = re.compile(r"\A(?i:the\s+)?(?i:final\s+)?(?i:answer)\s+(?i:is)\s*:?\s*")
_HEADING = re.compile(r"^[#*_\s]*(?:final answer|answer)[#*_:\s]*$", re.IGNORECASE | re.MULTILINE)
# The tail after a sentence's last "is/was/by/...": "Pride and Prejudice was written by Jane Austen." -> Jane Austen
_RESTATED = re.compile(r"^.*\b(?:is|was|are|were|be|by|called|named|it's|that's|they're|year|belongs\s+to|stands\s+for|"
                       r"ha(?:s|ve)(?=\s+the\b))\s+"
                       r"(?!(?:not|known|also)\b)(.+)$", re.IGNORECASE)
# ... else the tail after "in", "on" or "at" before a date or a number: "It fell in 1989.", "The wall fell on November
# 9, 1989.", "Water boils at 100 \u00b0C."
_RESTATED_WHEN = re.compile(r"^.*\b(?:in|on|at)\s+((?:[*_]*\w+\s+)?[*_]*\d.*)$", re.IGNORECASE)
# "I'd say Canberra.", "Definitely Canberra.", "My guess is Canberra.": a short reply's lead-in is not its answer.
_LEAD_IN = re.compile(r"\A(?:I'd say|I would say|I think|I believe|I guess|my guess is|my guess would be|probably|"
                      r"definitely|most likely|likely|certainly|surely|that's|that is|"
                      r"you(?:'re| are| might be| may be) thinking of|you mean|"
                      r"in short:?|in a word:?|in summary:?|tl;?dr:?|"
                      r"most commonly|commonly|usually|typically|generally|conventionally|"
                      r"mostly|mainly|primarily|chiefly|largely|predominantly)\s+", re.IGNORECASE)
# "... by Leonardo da Vinci in the early 1500s": when it happened, after the answer, is not the answer.
_WHEN_TAIL = re.compile(r"\s+(?:between\s+\d{3,4}\s+and\s+\d{3,4}|from\s+\d{3,4}\s+to\s+\d{3,4})\s*$"
                        r"|\s+(?:in|around|circa|c\.|during|from|since)\s+(?:the\s+)?(?:(?:early|mid|late)[-\s]+)?"
                        r"\d{2,4}(?:s|th century)?\s*$", re.IGNORECASE)
_ASIDE = re.compile(r"\s*\([^()]*\)\s*$")
# Chat models open with a pleasantry ("Sure! The capital of Australia is Canberra."): not the answer's sentence.
_PLEASANTRY = re.compile(r"\A\s*(?:sure|certainly|of course|absolutely|great question|good question|happy to help)"
                         r"\b[^.!?\n]{0,30}[.!]\s+", re.IGNORECASE)
# "is actually Canberra", "is definitely Canberra": the adverb is not part of the answer.
_ADVERB = re.compile(r"\A(?:actually|indeed|definitely|certainly|clearly|probably|likely|in fact|officially)\s+",
                     re.IGNORECASE)
# "Kangaroos are native to Australia.", "They're found in Australia.": where the answer is, not part of it.
_WHERE_FROM = re.compile(r"\A(?:native|indigenous|endemic|found|located|situated|based|spoken|grown|made)"
                         r"\s+(?:(?:mainly|mostly|chiefly|only|primarily)\s+)?(?:to|in|on|at)\s+", re.IGNORECASE)
# "Canberra, not Sydney", "Canberra, located in the ACT", "Canberra, which ...": an aside after a comma, opened by a
# word that opens one or a participle opening a clause ("the Pacific Ocean, covering a third of Earth", "George
# Washington, inaugurated in 1789", "Leonardo da Vinci, probably between 1503 and 1519"); not the next item of a list
# ("red, white, and blue", "swimming, cycling and running"), a place's region ("Washington, D.C.") or a clause with the
# answer in it ("Many guess Sydney, but it is Canberra").
_COMMA_ASIDE = re.compile(r",\s+(?=[a-z]+ing\s+(?!and\b|or\b)\w|[a-z]+(?:ed|en|wn|rn)\s+(?:in|on|at|by|from|as|to|"
                          r"during|after|before)\b|(?:not|which|who|whose|where|when|located|situated|"
                          r"known|famous|home|founded|built|named|called|being|the|a|an|as|since|because|although|"
                          r"though|while|also|often|in|on|at|from|with|of|for|due|thanks|owing|around|circa|c\.|"
                          r"about|approximately|roughly)\b|(?:probably|possibly|(?:most\s+)?likely|perhaps|presumably)\s+(?![A-Z]))")
# "Canberra, of course.", "Pacific Ocean, by far."
_HEDGE_TAIL = re.compile(r",\s*(?:of course|obviously|naturally|surely|I (?:think|believe)|probably|definitely|"
                         r"certainly|by far|easily|for sure|no doubt|I'?m (?:(?:fairly|pretty|quite|almost) )?"
                         r"(?:sure|certain|confident))[.!]?\s*$", re.IGNORECASE)
# A second guess offered beside the first: "Canberra? Or Sydney?", "Sydney, or is it Canberra?", "or maybe Sydney".
_OR_ELSE = re.compile(r"(?i)\?\s*or\b|\bor\s+(?:is|was)\s+it\b|\bor\s+(?:maybe|perhaps|possibly)\b")
_SAID_ANSWER = frozenset(("answer", "correct", "right", "final"))  # "Canberra is the answer."
# The answer first, the question restated after it: "Canberra is the capital of Australia.", "Jane Austen wrote
# Pride and Prejudice." Told from "The capital of Australia is Canberra." by the question's words.
_SUBJECT_FIRST = re.compile(r"^(.+?)\s+(?:is|was|are|were|became|remains|remained|wrote|painted|composed|discovered|"
                            r"invented|founded|directed|designed|built|created|won|penned|authored|sculpted|coined|sang|"
                            r"recorded|performed|stands\s+for|"
                            r"developed|formulated|proposed|pioneered|introduced|ha(?:s|ve|d)(?:\s+(?:long\s+|always\s+)?"
                            r"been)?|(?:has\s+)?(?:serves|served|ranks|ranked|stands|stood|functions|acts)\s+as)"
                            r"\s+(?!(?:not|n't)\b)(.+)$", re.IGNORECASE)
# "Australia's capital: Canberra", "- **Capital:** Canberra" (a line of a list)
_LABEL = re.compile(r"^(?:(?:[-*+\u2022]|\d{1,2}[.)])\s+)?(?:\*\*|__)?([^:*_]{2,60}?)(?:\*\*|__)?:(?:\*\*|__)?\s+(.+)$")
# The question restated, then an arrow, "=" or a dash, then the answer: "Australia \u2192 Canberra", "Capital of
# Australia = Canberra", "Pride and Prejudice \u2014 Jane Austen".
_PAIR = re.compile(r"^(?:(?:[-*+\u2022]|\d{1,2}[.)])\s+)?(?:\*\*|__)?(.{2,60}?)(?:\*\*|__)?\s*"
                   r"(?:\u2192|->|=>|=|\s[\u2014\u2013-])\s*(.+)$")
# A cleft sentence: "It was Leonardo da Vinci who painted it.", "It is Canberra that is the capital."
_CLEFT = re.compile(r"^(?:it|that)\s+(?:is|was)\s+(.+?)\s+(?:who|that|which)\s+(.+)$", re.IGNORECASE)
# A reason after what is said of the subject: "Mars is known as the Red Planet because of its iron oxide."
_REASON = re.compile(r",|\s(?:because|since|due to|thanks to|owing to|given)\b", re.IGNORECASE)
_KNOWN_AS = re.compile(r"\A(?:(?:also|often|commonly|usually|widely|popularly|sometimes|famously|best)\s+)?"
                       r"(?:(?:known|referred to|described|regarded)\s+as|called|nicknamed|dubbed)\s+", re.IGNORECASE)
# The last clause of a sentence that sets another thing against the answer: "Sydney is the largest city, but Canberra is
# the capital."
_BUT_CLAUSE = re.compile(r"(?:,|;)\s*(?:but|while|whereas|yet)\s+(.+)$", re.IGNORECASE)
# More said of the answer after "and": "... written by Jane Austen and published in 1813."
_AND_MORE = re.compile(r"\s+and\s+(?=(?:is|was|are|were|has|have|had|became|remains|comes|came|published|released|"
                       r"first|later|now|then|still)\b)", re.IGNORECASE)
# The answer in a participle phrase that opens the reply: "Written by Jane Austen, it was first published in 1813."
_BY_FIRST = re.compile(r"\A(?:[A-Z][a-z]+(?:ed|en|wn))\s+by\s+([^,]{2,60}?),\s+(?:it|this|the|which)\b")
# A reply that opens by denying a guess before its answer: "Not Sydney! The capital is Canberra.", "Charlotte
# Bront\u00eb? No \u2014 it was Jane Austen."
_DENIED_FIRST = re.compile(r"\A\s*(?:not\s+[^.!?,;\n]{1,40}[.!]+|[^.!?\n]{1,60}\?\s*no\b[.!,:;]?\s*[\u2014\u2013-]?)"
                           r"\s+", re.IGNORECASE)
_EITHER = re.compile(r"(?i)\bor\b")
_BESIDE = frozenset(("at", "in", "on", "of"))  # "100 \u00b0C at sea level"
_DEGREES = {"c": "celsius", "f": "fahrenheit"}  # "100 \u00b0C", normalised: its sign dropped
_DENIAL = re.compile(r"(?i)\A(?:not|never|no)\b")
_NUMBER_ASKED = re.compile(r"(?i)\s*(?:when|how|(?:in\s+)?(?:what|which)\s+(?:year|date|day|month|century))\b")
# A reply's sentences (and what a dash or a semicolon sets apart), a clause after a subordinate one and what may
# open one: "So the capital of Australia is Canberra.", "While Sydney is the largest city, Canberra is the capital."
LATER_SENTENCES = 60
_SENTENCE_END = re.compile(r"(?<=[^\s.A-Z])[.!?]+(?:\s+|$)|;\s+|\s[\u2014\u2013-]\s|\n+")
_SUBORDINATE = re.compile(r"(?i)\A(?:while|whilst|although|though|even though|if|whereas|when)\b[^,]{1,80},\s*(.+)$")
_INSERTED = re.compile(r",\s*(?:however|though|in fact|of course|actually|indeed|therefore|thus|then)\s*,",
                       re.IGNORECASE)
_CONCLUDES = re.compile(r"\A(?:(?:and\s+)?so|thus|therefore|hence|in fact|actually|instead|rather|but|however|yet|"
                        r"overall|ultimately|in the end|that said)\b[,:]?\s*", re.IGNORECASE)
_IT_IS = re.compile(r"\A(?:it'?s|it\s+(?:is|was)|that'?s|that\s+(?:is|was)|the answer is)\s+"
                    r"(?=[*_\"\u201c]*(?-i:[A-Z0-9\u00c0-\u00de]))(.+)$", re.IGNORECASE)  # a name or a number
# A reply that opens with its thinking ("Hmm, let me think.", "Okay, let's see."): not the answer's sentence.
_OPENER = re.compile(r"\A\s*(?:(?:(?:hmm+|okay|ok|alright|well)[\s,]+)?(?:let me think(?: about (?:this|it)|"
                     r" step by step|(?: this| it) through)?|let's think(?: about (?:this|it))?(?: step by step)?|"
                     r"let's see|let me see|let's break (?:this|it) down)|hmm+)[.!:\u2026]+\s+", re.IGNORECASE)
# The question said back as a sentence of its own before the answer: "The capital of Australia? That's Canberra."
_ECHO = re.compile(r"\A\s*([^.!?\n]{3,120})\?\s+(?=\S)")
# The wrong answer denied, the right one said: "Sydney is not the capital; Canberra is.", "It's not Sydney, it's
# Canberra.", "Not Sydney, but Canberra."
_CONTRAST = re.compile(r"^(?:.+?\s+(?:is|was|are|were|did|does|do)\s*(?:not|n't)\b.*?|(?:it'?s\s+|it\s+(?:is|was)\s+)?"
                       r"not\s+(?!(?:sure|certain|quite|really|entirely|exactly|completely)\b).+?)"
                       r"\s*[;,\u2014\u2013]\s*(?:but\s+)?(?:(?:it'?s|it\s+(?:is|was)|that'?s|that\s+(?:is|was))\s+)?"
                       r"([^,;]+?)(?:\s+(?:is|was|are|were|did|does|do))?[.!]?$", re.IGNORECASE)
_TABLE_RULE = re.compile(r"^\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?$")  # a markdown table's "|---|---|"
_FILLER = frozenset(("a", "an", "the", "of", "in", "on", "at", "to", "for", "by", "and", "or", "is", "was", "are",
                     "were", "be", "it", "its", "what", "which", "who", "whom", "whose", "when", "where", "how", "did",
                     "does", "do", "has", "have", "had", "this", "that", "as", "with", "from"))


def normalize(text):
    """Lowercase, drop punctuation, articles, thousands separators, a Latin letter's accents and a trailing period;
    collapse spaces. "S\u00e3o Paulo" is "sao paulo" and "Stra\u00dfe" "strasse": a reply and a reference that differ
    only in their accents (a model that drops them, a dataset that does) name the same thing. Other scripts keep their
    marks (Japanese "\u304c" is not "\u304b")."""
    text = fold_accents(unlatex(str(text)).strip().casefold())
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", re.sub(r"\[\^?\d{1,3}\]", "", text))  # "Canberra[1]": a citation
    text = text.translate(_PUNCT)
    text = "".join(ch for ch in text if unicodedata.category(ch) != "So" and ch != "\ufe0f")  # "Canberra \u2705"
    text = _ARROWS.sub(" ", text)  # "\u2192 Canberra"
    text = _ARTICLES.sub(" ", text)
    text = _NUMBER_WORD.sub(lambda m: _NUMBER_WORDS[m.group()], text)
    text = " ".join(text.split())
    return text.rstrip(".").strip()


def find_answer(reply, question=None):
    """(answer, rule): the reply's answer as written (None when it gives none) and the rule that found it.
    ``question``: the prompt, when known; it tells a sentence or label that restates it from the answer beside it."""
    text = plain_apostrophes(answer_part(reply, tags=True))
    if not text.strip() or (len(text) <= 300 and _OR_ELSE.search(text) and not _EITHER.search(question or "")):
        return None, None  # empty, or a short reply torn between two answers
    tail = after_correction(text)
    if tail is not None:
        answer, rule = _find(tail, question)
        if answer is not None:
            return answer, rule
    return _find(text, question)


def _content(text):
    """The words of ``text`` that carry meaning (normalised, a possessive's "s" dropped, filler words out)."""
    return {w for w in normalize(re.sub(r"['\u2019]s\b", "", str(text))).split() if w not in _FILLER}


@functools.lru_cache(maxsize=8)
def _asked(question):
    """The question's meaningful words, and the words that restate any question ("the answer"; "number" when it asks
    how many: "Number of continents: 7"): read once per question (a reply's every line is checked against them)."""
    words = _content(question) | _SAID_ANSWER
    return frozenset(words | _COUNT_WORDS if _HOW_MANY.search(question) else words)


def _restates(part, question, loose=False):
    """Whether ``part`` says the question again: its meaningful words mostly the question's (or "the answer");
    ``loose``: every one of its words is the question's, however few ("Australia" of "...capital of Australia?")."""
    if not question:
        return False
    words, asked = _content(part), _asked(question)
    common = len(words & asked)
    if loose:
        return bool(words) and common == len(words)
    return bool(words) and common >= min(2, len(words)) and common >= 0.6 * len(words)


def _tidy(answer, question=None):
    """A restated answer without a leading adverb, a trailing lower-case aside, a trailing (aside), a qualifier that
    restates the question or when it happened: "actually Canberra, not Sydney" -> "Canberra", "Canberra, Australia"
    -> "Canberra", "Leonardo da Vinci in the early 1500s" -> "Leonardo da Vinci"."""
    answer = _WHERE_FROM.sub("", _ADVERB.sub("", answer.strip()))  # "are native to Australia"
    answer = _ASIDE.sub("", _COMMA_ASIDE.split(answer, maxsplit=1)[0]).strip()
    answer = _AND_MORE.split(answer, maxsplit=1)[0]  # "Jane Austen and published in 1813"
    answer = re.sub(r"(?i)\s+(?:itself|himself|herself|themselves)[.!]?\Z", "", answer)  # "the Sun itself"
    untimed = _WHEN_TAIL.sub("", answer)
    return _unqualified(untimed if untimed.strip() else answer, question)


def _unqualified(answer, question):
    """``answer`` without a last comma part that restates the question ("Canberra, Australia" asked for Australia's
    capital); a list keeps its items ("blue, white, and red")."""
    head, comma, tail = answer.rpartition(",")
    if comma and head.strip() and (_restates(tail, question) or _restates(tail, question, loose=True)):
        return head.strip()
    counted = _COUNTED.match(answer.strip().rstrip(".!"))
    if counted and _restates(counted.group(2), question, loose=True):
        return counted.group(1)  # "7 continents" for "How many continents...?"
    return answer


def _unlabel(line, question, nested=False):
    """The value of a label line that restates the question ("- **Capital:** Canberra" -> "Canberra"), else None;
    a label in that value is read once more ("**Australia** \u2013 capital: **Canberra**"), no deeper."""
    if not question:
        return None
    line = _HEDGE_TAIL.sub("", _ASIDE.sub("", line).strip()).rstrip(".!")
    pair = _PAIR.match(line)
    for label in (_LABEL.match(line), pair):
        if label and (_restates(label.group(1), question) or _restates(label.group(1), question, loose=True)):
            value = re.split(r"\s\|\s", label.group(2))[0].strip(" *_")  # "Capital: Canberra | Population: ..."
            value = (None if nested else _unlabel(value, question, nested=True)) or value
            if not _restates(value, question) and not _DENIAL.match(value):
                return value
    if (pair and not nested and _restates(pair.group(2), question) and not _DENIAL.match(pair.group(2))
            and normalize(pair.group(1))):
        return pair.group(1).strip(" *_")  # "3. Canberra \u2013 the capital \u2705": the answer, then what it is
    return None


def _table_answer(lines, question):
    """The answer in a markdown table (a header, its ``|---|`` line, rows): the first row's one cell that does not say
    the question again ("| Pride and Prejudice | Jane Austen |" for "Who wrote Pride and Prejudice?"), else None."""
    at = next((i for i in range(len(lines) - 2) if lines[i].strip().startswith("|")
               and _TABLE_RULE.match(lines[i + 1].strip())), None)
    if at is None:
        return None
    row = [cell.strip(" *_") for cell in lines[at + 2].strip().strip("|").split("|")]
    answers = [cell for cell in row if normalize(cell) and not _restates(cell, question)
               and not _restates(cell, question, loose=True)]
    return answers[0] if len(answers) == 1 else None


def _subject_first(sentence, question):
    """The answer said first, the question restated after it, in ``sentence`` or in its last clause after "but"
    ("Canberra is the capital of Australia.", "Jane Austen wrote it, publishing it in 1813.", "Mars is known as the Red
    Planet because of ...", "Sydney is the largest city, but Canberra is the capital."): its subject match, or None."""
    clause = _BUT_CLAUSE.search(sentence)
    for part in (clause.group(1) if clause else None, sentence):
        subject = (_CLEFT.match(part) or _SUBJECT_FIRST.match(part)) if part else None
        if subject is None:
            continue
        said_of = _REASON.split(subject.group(2), maxsplit=1)[0]  # "wrote it, publishing..."
        said_of = _WHEN_TAIL.sub("", said_of) or said_of  # "painted the Mona Lisa between 1503 and 1519"
        said_of = _KNOWN_AS.sub("", said_of)  # "is known as the Red Planet", "is often called the Red Planet"
        name = _appositive(subject.group(1))
        if (len(name.split()) <= 6 and not _restates(name, question) and name.strip(" *_").lower() not in _NO_SUBJECT
                and not re.search(r"(?i)\b(?:that|it's|it\s+is)\b", name)
                and (_restates(said_of, question) or said_of.strip(" .!").lower() in _PRONOUN
                     or bool(question and _WHO.search(question) and _ROLE.match(said_of.strip())))):
            return name
    return None


def _appositive(subject):
    """The name in a subject that sets it beside its description with commas ("The fourth planet from the Sun, Mars,"
    -> "Mars"; "Jane Austen, the English novelist," -> "Jane Austen"), else the subject as it is. A description opens
    with a determiner, so that a list ("Swimming, cycling and running") stays whole."""
    parts = [part.strip() for part in subject.strip().rstrip(",").split(",")]
    if len(parts) != 2:
        return subject
    names = [part for part in parts if _NAME.fullmatch(part) and part.split()[0].lower() not in _DETERMINERS]
    described = [part for part in parts if part.split() and part.split()[0].lower() in _DETERMINERS]
    return names[0] if len(names) == 1 and len(described) == 1 else subject


def _named_as(found, reference):
    """Whether ``found`` names ``reference`` (normalised) after a description of it ("the English novelist Jane
    Austen", "the planet Mars", "the city of Canberra", "the chemical symbol Au") or surname first ("Austen, Jane").
    The description's last word is a lower-case noun, a title or a kind of place ("New York" does not name York),
    "of" ends it only after a kind of place ("the capital city of Australia" is not Australia), nothing in it
    denies or relates ("not Canberra", "a rival of Jane Austen") and no comma parts it ("Sydney, maybe Canberra")."""
    text = _ASIDE.sub("", str(found)).strip().rstrip(".!")
    surname, comma, given = text.partition(", ")
    if (comma and _NAME.fullmatch(surname) and _NAME.fullmatch(given) and len(surname.split()) == 1
            and normalize(f"{given} {surname}") == reference):
        return True
    words = text.split()
    for at in range(1, min(len(words), 6)):
        if normalize(" ".join(words[at:])) != reference:
            continue
        head, noun = [word.lower().strip(",;:") for word in words[:at]], words[at - 1]
        if head[-1] == "of":  # "the city of Canberra"; not "the capital city of Australia"
            place = head[:-1]
            if not place or place[-1] not in _PLACE_OF or len(place) > 2 or place[0] not in _DETERMINERS | _PLACE_OF:
                return False
            head, noun = place, words[at - 2]
        return ((noun[:1].islower() or noun.lower().rstrip(".") in _TITLES or set(head) <= _POSSESSIVE)
                and not any(word in _NOT_DESCRIPTOR for word in head) and "," not in "".join(words[:at - 1])
                and all(word[:1].islower() or _NATIONALITY.fullmatch(word) or word.lower().rstrip(".") in _TITLES
                        for word in words[1:at]))  # another name in it: "The Amazon beats the Nile."
    return False


def _asked_around(found, reference, question):
    """Whether ``found`` is ``reference`` with words of the question beside it, at most four on either end: "Nile
    River" for the longest river's "Nile", "President George Washington" for the first President's, "100 \u00b0C"
    for a boiling point in degrees Celsius, "Jane Austen's novel" for who wrote the novel; or the reference is
    ``found`` with such words ("The Pacific" for "the Pacific Ocean" asked for the largest ocean)."""
    if not question or _EITHER.search(question):  # "The Nile or the Amazon?": "Amazon Nile" is both, not one
        return False
    said = normalize(re.sub(r"['\u2019]s\b", "", str(found)))  # "Jane Austen's novel" for "Who wrote the novel...?"
    words = [_DEGREES.get(word, word) for word in re.sub(r"(?<=\d)([cf])\b", r" \1", said).split()]
    asked = _asked(question) | _BESIDE
    for longer, shorter in ((words, reference.split()), (reference.split(), words)):  # "The Pacific" for its Ocean
        for start in range(min(5, len(longer))):
            for end in range(len(longer), max(start, len(longer) - 5), -1):
                if (start or end < len(longer)) and longer[start:end] == shorter and all(
                        word in asked for word in longer[:start] + longer[end:]):
                    return True
    return False


def _possessor(found, reference, question):
    """Whether ``found`` is the reference's work for a "Who wrote/painted ...?" question ("Jane Austen's novel",
    "Leonardo da Vinci's most famous painting")."""
    work = _WORK.match(_ASIDE.sub("", str(found)).strip().rstrip(".!"))
    return bool(work and question and _WHO.search(question) and normalize(work.group(1)) == reference)


def _later(text, question):
    """The answer a later sentence gives when the first gives none for sure: the last sentence (or its clause after a
    "while ...," or a "but") that restates the question beside an answer ("So the capital of Australia is Canberra.",
    "..., but the capital is actually Canberra.", "While Sydney is the largest city, Canberra is the capital."), else
    the last that says "it's X" ("In fact, it's Canberra.", "... think again \u2014 it's Canberra."). Read from the
    end, the last ``LATER_SENTENCES`` only: a reply's conclusion closes it, and a long one costs no more to read."""
    says = None
    sentences = _SENTENCE_END.split(_INSERTED.sub("", text))
    for n in range(len(sentences) - 1, max(-1, len(sentences) - 1 - LATER_SENTENCES), -1):
        sentence = _CONCLUDES.sub("", sentences[n].strip(" *_\t"))
        parts = [sentence] if n else []  # the first sentence as a whole was read before
        for clause in (_SUBORDINATE.match(sentence), _BUT_CLAUSE.search(sentence)):
            if clause:
                parts.append(_CONCLUDES.sub("", clause.group(1).strip()))
        for part in reversed(parts):
            subject = _subject_first(part, question)
            if subject:
                return subject
            restated = _restated(part)
            if restated and _restates(part[:restated.start(1)], question) and not _restates(restated.group(1),
                                                                                           question):
                return restated.group(1)
            it_is = _IT_IS.match(part)
            if says is None and it_is and not _restates(it_is.group(1), question):
                says = it_is.group(1)
    return says


def _one_name(sentence, question):
    """The one name a short sentence (300 characters at most) gives besides the question's own ("In Brazil, people speak
    Portuguese." -> Portuguese; "Mars gets its nickname from its colour." -> Mars; a name opening it only before a
    lower-case word, not "Swimming, cycling and running."), else None: two names, a possessive ("Jane Austen's
    novel" is ``_possessor``'s), a sentence that is not a clause (fewer than two lower-case words but a name's
    particles: "The river Nile.", "\u2192 Leonardo da Vinci"), that denies or says who thinks so ("Most people think
    Sydney."), that says its subject is something not asked ("Canberra is the author."), or a question asking for a
    number or a date."""
    lower = [w for w in re.findall(r"\b[a-z][\w'-]*", sentence[:301]) if not _NAME.fullmatch(w)]  # not "da" in a name
    if (not question or len(sentence) > 300 or len(lower) < 2 or _NUMBER_ASKED.match(question) or set(lower) & _WHO_SAYS
            or re.search(r"(?i)\b(?:not|no|never|nor)\b|n't\b", sentence)):
        return None
    said = _SUBJECT_FIRST.match(sentence)
    if (said and not _content(said.group(2)) & _asked(question)
            and re.match(r"(?i)\s+(?:is|was|are|were|became|remains|remained|ha[sd]|have)\b", sentence[said.end(1):])):
        return None
    names = []
    for found in _NAME.finditer(sentence):
        words = found.group().split()
        while words and (re.sub(r"\W", "", words[0].lower()) in _NOT_A_NAME or words[0].lower() in _FILLER):
            words.pop(0)  # "It's Jane Austen's", "In Brazil", "The Nile"
        while words and words[-1].lower() in _FILLER:
            words.pop()
        name = " ".join(words)
        if len(name) < 2 or not name[:1].isupper() or _restates(name, question, loose=True):
            continue
        names.append((name, bool(found.start() or re.match(r"\s+[a-z]", sentence[found.end():]))))
        if len(names) > 1 or re.search(r"['\u2019]s\Z", name):
            return None
    return names[0][0] if names and names[0][1] else None


def _counted(sentence, question):
    """The one count in ``sentence`` of the thing a "How many ...?" question counts ("The Earth has seven continents."
    -> "seven"), else None."""
    if not (question and _HOW_MANY.search(question)):
        return None
    counts = {normalize(n) for n, noun in _COUNT_NOUN.findall(sentence) if _restates(noun, question, loose=True)}
    return counts.pop() if len(counts) == 1 else None


def _restated(text):
    """The tail of a sentence that restates the question before its answer (``_RESTATED``, else ``_RESTATED_WHEN``)."""
    return _RESTATED.search(text) or _RESTATED_WHEN.search(text)


def _first_sentence(text):
    line = next((x for x in text.splitlines() if x.strip()), "")
    first = re.split(r"(?<=[^\s.A-Z])[.!?](?:\s|$)|\s[\u2014\u2013-]\s|\u2014|;\s", line.strip(), maxsplit=1)[0]
    # "Au (from the Latin aurum)." -> Au; "Canberra, of course." -> Canberra
    return _HEDGE_TAIL.sub("", _ASIDE.sub("", first).strip()).strip().rstrip(".!")


def _find(text, question=None):
    for inner in reversed(boxed(text)):  # \boxed{\text{Canberra}}
        if normalize(inner):
            return unlatex(inner).strip(), "boxed"
    for item in reversed(json_answers(text)):  # {"answer": "Canberra"}
        if normalize(item):
            return str(item), "json"
    said = [_SAID_AGAIN.sub("", m.group(1)) for m in _ANSWER_IS.finditer(text)]
    said = [_tidy(_unlabel(answer, question) or answer, question) for answer in said]
    said = [answer for answer in said if normalize(answer) and not answer.startswith("|")]  # not a table's header
    if said:  # "**Final answer:** Canberra", "The answer is Canberra." (the last one said)
        return said[-1], "answer_phrase"
    for heading in reversed(list(_HEADING.finditer(text))):  # "## Answer\n\nCanberra"
        below = [line for line in text[heading.end():].splitlines() if line.strip()]
        if below:
            return below[0], "final_line"
    text = _DENIED_FIRST.sub("", _OPENER.sub("", _PLEASANTRY.sub("", text)))
    echo = _ECHO.match(text)
    if echo and _restates(echo.group(1), question):  # "The capital of Australia? That's Canberra."
        text = text[echo.end():]
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None, None
    count = _COUNT_FIRST.match(lines[0]) if question and _HOW_MANY.search(question) else None
    if count and (count.group(2) is None or _restates(count.group(2), question, loose=True)):
        return count.group(1), "restated"  # "There are 7 continents: Africa, ...", "Seven: Africa, ..."
    for line in lines:  # "Australia's capital: Canberra", "- **Capital:** Canberra"
        value = _unlabel(line, question)
        if value is not None:
            return _tidy(value, question), "restated"
    cells = _table_answer(lines, question)
    if cells is not None:  # "| Pride and Prejudice | Jane Austen |" under its header
        return _tidy(cells, question), "table"
    sheet = [_LABEL.match(_ASIDE.sub("", line).strip()) for line in lines]
    top = sheet[0]
    if (top is not None and all(sheet) and len(top.group(1).split()) <= 3
            and (len(lines) > 1 or re.match(r"(?:[-*+\u2022]\s+)?(?:\*\*|__)", lines[0].strip())
                 or (question and _WHO.search(question) and _ROLE.match(top.group(1).strip())))):  # "Author: X"
        # A fact sheet whose labels do not say the question again ("- **Author:** Jane Austen\n- **Published:**
        # 1813" for "Who wrote...?", or its one bold label line): its first line is the answer's.
        return _tidy(top.group(2).strip(" *_"), question), "fact_sheet"
    contrast = _CONTRAST.match(re.split(r"(?<=[^\s.A-Z])[.!?](?:\s|$)", lines[0].strip(), maxsplit=1)[0])
    if contrast and normalize(contrast.group(1)):  # "Sydney is not the capital; Canberra is."
        return _tidy(contrast.group(1), question), "contrast"
    by = _BY_FIRST.match(lines[0].strip())
    if by:  # "Written by Jane Austen, it was first published in 1813."
        return _tidy(by.group(1), question), "restated"
    text = _LEAD_IN.sub("", text)  # "I'd say Canberra."
    lines = [line for line in text.splitlines() if line.strip()]
    first = _first_sentence(text)
    # The reply's one line and its first sentence, each up to an aside after a comma ("Canberra, which ...") or a
    # qualifier that restates the question ("Canberra, Australia").
    whole = _HEDGE_TAIL.sub("", _ASIDE.sub("", lines[0]).strip())
    whole = _unqualified(_ASIDE.sub("", _COMMA_ASIDE.split(whole, maxsplit=1)[0].strip().rstrip(".!")), question)
    first_clause = _AND_MORE.split(_COMMA_ASIDE.split(first, maxsplit=1)[0].strip(), maxsplit=1)[0]
    first_clause = _unqualified(_ASIDE.sub("", first_clause), question)  # "... is Canberra and has been since 1913"
    subject = _subject_first(first, question) or _counted(first, question)
    short = len(lines) == 1 and whole == first_clause and len(whole.split()) <= 8
    if short and not _restated(whole) and not subject and not _restates(whole, question):
        name = _one_name(whole, question)
        if name is not None and name != whole.strip(" *_"):  # "In Brazil, people speak Portuguese."
            return name, "restated"
        # "Canberra", "canberra.", "**Jane Austen**"
        bold = re.fullmatch(r"\s*\*\*(.+?)\*\*[.!]?\s*", whole)
        return (bold.group(1) if bold else whole), "whole"
    emphasised = set(re.findall(r"\*\*([^*\n]+?)\*\*", text))
    if len(emphasised) == 1:  # "The capital of Australia is **Canberra**, not Sydney."
        return emphasised.pop(), "bold"
    if subject:  # "Canberra is the capital of Australia.", "Jane Austen wrote Pride and Prejudice."
        return _tidy(subject, question), "restated"
    # The clause before the first aside ("... is Canberra, which is well documented"), else the sentence without its
    # last aside ("The colours, from the mast, are blue, white, and red, which ..."), else the whole sentence.
    asides = list(_COMMA_ASIDE.finditer(first))
    restated = (_restated(first_clause) or (asides and _restated(first[:asides[-1].start()]))
                or _restated(first))
    sure = restated and len(_content(restated.string[:restated.start(1)]) & _asked(question or "")) >= 2
    if not sure and not (_NAME.fullmatch(first.strip(" *_")) or len(first.split()) <= 2):
        later = _later(text, question)  # "Many people assume Sydney. However, the capital of Australia is Canberra."
        if later is not None and normalize(later):
            return _tidy(later, question), "restated"
    name = None if sure else _one_name(first_clause, question)
    if name is not None:  # "George Washington took office in 1789.", "Mars earns that title thanks to its soil."
        return _tidy(name, question), "restated"
    if restated and len(_tidy(restated.group(1), question).split()) <= 6:  # "The capital of Australia is Canberra."
        return _tidy(restated.group(1), question), "restated"
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
        question = self.extract(row)
        found, rule = find_answer(response, question)
        said = None if found is None else normalize(found)
        loose = rule != "first_sentence"  # a first sentence taken whole for want of an answer describes no name
        glossed = (_GLOSSED.match(answer_part(response, tags=True).strip())
                   if rule in ("whole", "first_sentence") else None)
        glosses = [normalize(g) for g in glossed.groups() if not _DENIAL.match(g.strip())] if glossed else []
        # Any of the reference's texts (TriviaQA's aliases, Natural Questions' answers), each losing what an answer
        # would lose: "Paris, France" asked for France's capital is Paris.
        for text in reference_texts(row[CONFIG["reference"]]):
            reference = normalize(_unqualified(text, question))
            date = _DATE_OF_YEAR.fullmatch(said or "") if re.fullmatch(r"\d{4}", reference) else None
            answer = date.group(1) if date else said  # a year asked, a date given: "November 9, 1989"
            # A name after its description, beside words of the question, as a work's owner, or where it is.
            if answer is not None and (answer == reference or (loose and (
                    _named_as(found, reference) or _asked_around(found, reference, question) or _possessor(
                        found, reference, question) or normalize(_WHERE_TAIL.sub("", str(found))) == reference))):
                return {"score": 1.0, "answer": answer, "extracted": True, "rule": rule}
            if reference in glosses and min(len(g) for g in glosses) <= 3:  # "H (hydrogen)"
                return {"score": 1.0, "answer": reference, "extracted": True, "rule": rule}
        return {"score": 0.0, "answer": said, "extracted": said is not None, "rule": rule}
