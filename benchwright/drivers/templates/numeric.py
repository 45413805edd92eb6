"""task_impl.py written by Benchwright's builtin driver: numeric final answer (GSM8K style).

The reference is a number, or a worked solution ending ``#### <number>``. The answer is read from the reply's answer
part (a reasoning block skipped; only the last ``<answer>...</answer>`` element when it has one; after a
self-correction, the corrected part first) by the first rule that finds one: the last ``#### <number>``, the last
``\\boxed{...}``, a JSON ``{"answer": ...}``, the last "the answer is <number>" / "answer: <number>", a number opening
the reply as its own sentence, its one bold value ("She sold **72 clips**: 48 in April..."), a total said first with its
parts or working after it ("72 clips: 48 in April and 24 in May", "70 left: 100 minus 30", "72 clips in total. That's 48
in April plus 24 in May."), else a count spelled out in the last sentence of what the question asks about ("She makes
eighteen dollars a day."), else the last number in the reply outside its asides (so "42, no wait, 41" is 41 and "72
apples (3 x 24)" is 72), its closing talk ("Let me know if you'd like step 2 again!") and what follows the answer with
no number of its own (a check, an explanation, the question's givens restated), none in a reply cut off mid-sentence,
else, in a reply with no digits, the last count spelled out ("eight legs"). Numbers compare exactly as fractions:
``1,234``, ``1234.0``, ``$1,234``, ``\\frac{3}{4}`` = ``0.75``, ``6e8`` = ``6 \\times 10^8``, ``600 million`` =
``600,000,000``, ``$70k`` = ``70,000``, ``3\u00bd`` = ``3.5``; a number written with a scale also matches the number
before it ("$1.5 million" for a reference of 1.5, a question counting in millions), and a quantity in two units matches
it in either ("2 hours and 30 minutes" for 150 or 2.5). Standard library only;
CONFIG names the ``input`` and ``reference`` columns.
"""

import functools
import re
from fractions import Fraction
from itertools import islice

from benchwright.drivers.templates._quantities import spelled_compounds, spelled_fractions  # inlined by render()
from benchwright.drivers.templates._reply import (  # inlined by render()
    after_correction,
    answer_part,
    boxed,
    json_answers,
    plain_apostrophes,
    unlatex,
    without_closing,
)

CONFIG = {"input": "question", "reference": "answer"}
SYSTEM_PROMPT = ("Solve the problem step by step. End your reply with the final numeric answer on its own line, "
                 "written as '#### <number>'.")

# A scale after a number: "600 million", "70 thousand", "$70k", "$1.5M", "$2bn"; not "5 km", "3 MB" nor "thousandths".
_SCALE = r"\s?(?:thousand|million|billion|trillion)(?![\w])|(?:[kKMB]|bn)(?![\w])"
_SCALES = {"thousand": 3, "million": 6, "billion": 9, "trillion": 12, "k": 3, "m": 6, "b": 9, "bn": 9}
# A number as models write it: a sign, a currency symbol, thousands separators (commas, or no-break or thin spaces as
# in "70\u202f000"; not plain spaces: "5 100" may be two numbers), decimals, a fraction a/b, a scientific exponent
# (6.02e23, 6.02 x 10^23) or a scale; not the digits of a power ("m^2") or of a name ("CO2", "x1").
_NUMBER = (r"(?<![\w^.])[-\u2212]?\s?(?:[$\u20ac\u00a3\u00a5]|USD\s?|EUR\s?)?\s?[-\u2212]?"
           r"(?:\d{1,3}(?:,\d{3})+|\d{1,3}(?:[\u00a0\u202f\u2009]\d{3})+|\d+)(?:\.\d+)?(?:\s?/\s?\d+(?!\d|\.\d))?"
           r"(?:[eE][-+]?\d+(?![\w])|\s?(?:x|\u00d7|\\times|\*)\s?10\s?\^\s?\{?[-+\u2212]?\d+\}?|" + _SCALE + ")?"
           r"|(?<![\w^.])[-\u2212]?\.\d+")
_NUMBER_RE = re.compile(_NUMBER)
_HASHES = re.compile(r"####\s*\**\s*(" + _NUMBER + ")")
# "The answer is 18", "Answer: 18", "total: 18"; not "in total (3 boxes" (a total needs its "is", "=" or ":") nor a
# "Longer answer: 3 boxes..." that opens an explanation.
_ANSWER_IS = re.compile(r"(?:(?<!long )(?<!longer )(?<!detailed )(?<!full )answer\**\s*(?:is|=|:|would be|will be)?"
                        r"|(?:result|total)\**\s*(?:is|=|:|would be|will be))\s*[:=]?\s*\**\s*[$\\(]*\s*("
                        + _NUMBER + ")", re.IGNORECASE)
# "72.", "**72**\n\nWorking: ...", "72 apples. Tom's 3 boxes hold 24 each." (a unit of a word or two before its period)
_LEADING = re.compile(r"\A[\s*_]*(" + _NUMBER + r")[\s*_]*(?:[a-zA-Z]+(?:[ \t]+[a-zA-Z]+)?[*_]*)?"
                      r"(?:[.!]?[*_]*\Z|[.!]?[*_]*\s*\n|[.!]\s)")
# The working an answer phrase's number may open: "The answer is 60 + 12 = 72", "Total = 120 - 45 = **75**",
# "2^{10} = 1024". It runs to the clause's end (a line's, a sentence's, ", " or ";"); its result is the last side of the
# chain that is a number alone (a unit after it allowed: "= 36 apples", "= 12 m^2"), so "72 = 60 + 12" is 72 too.
_OPENS_WORKING = re.compile(r"\s*(?:[-+=*/^\u2212\u00d7\u00f7\u00b7]|x\s*\d|\\(?:times|cdot|div)(?![a-zA-Z]))")
_CLAUSE_END = re.compile(r"\n|;|,\s|\.(?!\d)")
_UNIT = r"(?!x\s*\d)[a-zA-Z\u00b0][a-zA-Z\u00b0\s/]*(?:\^\{?\d\}?)?"  # "apples", "m^2"; not the "x 4" of "3 x 4"
_LONE = re.compile(r"[\s*_$]*(" + _NUMBER + r")[\s*_$%]*(?:" + _UNIT + r")?[*_]*\Z")
# A count spelled out ("A spider has eight legs.", "twenty-four"), read only from a reply with no digits at all.
_UNITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
          "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
_TENS = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_WORD_NUMBER = re.compile(r"\b(?:(" + "|".join(_TENS) + r")(?:[-\s](" + "|".join(_UNITS[1:10]) + r"))?|("
                          + "|".join(_UNITS) + r"))\b", re.IGNORECASE)
# Asides the last number is not read from while the reply has a number outside them: a parenthetical that shows working
# without its result or opens an aside ("72 apples (3 boxes \u00d7 24 each)", "(If each box had 25, it would be 75.)";
# not "(3 \u00d7 24 = 72)" nor "(i.e., 72)", which say the result), and a note on a case that is not the question's
# ("Note that if one box were missing, it would be 48."), and how sure the model says it is ("Confidence: 90%", "(95%
# confident)", as prompts in Humanity's Last Exam's format ask).
_ASIDES = re.compile(r"\(\s*(?i:if|e\.g\.|since|because|assuming|for example|not)\b[^()]*\)"
                     r"|\((?=[^()]*\d)(?=[^()]*(?:[+*\u00d7\u00f7\u00b7]|\bx(?=\s*\d)|\\times|\\cdot))[^()=]*\)"
                     r"|(?<![^\s])(?i:note(?: that|:)?|n\.b\.:?|for comparison,?|by the way,?)\s+(?i:if)\b"
                     r"(?:[^.!?\n]|[.](?=\d))*[.!?]?"
                     r"|(?i:\bconfidence(?:\s+level)?)[\s*_]*(?:[:=\u2014\u2013-]|\bis\b)?[\s*_]*\d+(?:\.\d+)?\s*%?"
                     r"|\b\d+(?:\.\d+)?\s*%\s*(?i:confident|sure|certain)\b")
# A parenthetical that explains a number said before it (``_outside_asides``), and what tells one that says a result.
_PAREN = re.compile(r"\(([^()]*)\)")
# A closing note on its own line, to the reply's end: "_Note: this assumes she sells all 9 remaining eggs._"
_NOTE = re.compile(r"(?<=\n)[ \t>*_]*(?i:note|n\.b\.|assum\w*|caveat|disclaimer)\b[^:\n]{0,20}:[\s\S]*\Z")
# A closing clause that compares the answer with a given: "$20, $5 less than its $25 price.", "$20, which is 80% of
# the original $25.", "$20 \u2014 that's $5 off the $25 price."
_COMPARED = re.compile(r"(?:,|\s[\u2014\u2013-])\s+(?:[^,.!?\n]|[,.](?=\d))*?(?:\b(?:less|more|fewer|greater|cheaper)"
                       r"\s+than\b|\b(?:off|of)\s+(?:the|its|her|his|their)\s+(?:original\s+|full\s+|regular\s+)?"
                       r"[$\u20ac\u00a3]?\d)(?:[^.!?\n]|\.(?=\d))*[.!?]*\s*\Z")
_BY_HOW_MUCH = re.compile(r"\W+[$\u20ac\u00a3]?\d[\d,.]*\s*(?:[a-z]+\s+)?(?:less|more|fewer|greater|cheaper)\s+than\b")
_RESULT_WORD = re.compile(r"(?i)\b(?:so|therefore|thus|hence|total|altogether|in all|answer)\b")
# What opens a check of the answer or an explanation of it, at a line's or a sentence's start (``_without_afterword``):
# "Check: 9 \u00d7 2 = 18 \u2713", "Let me verify: ...", "To double-check, ...", "That is 48 in April plus 24 in May.",
# "Here's why: ...", "**Step-by-step:**".
_AFTERWORD = re.compile(r"(?im)(?:^|(?<=[.!?])[ \t]+)[ \t>*_#-]*(?:(?:sanity |quick |double[- ])?check(?:ing)?\b|"
                        r"verif(?:y|ying|ication)\b|let(?:'s| me| us) (?:double[- ])?(?:check|verify|confirm)\b|"
                        r"to (?:double[- ])?(?:check|verify|confirm)\b|that'?s\b|that is\b|this is because\b|"
                        r"here'?s (?:why|how)\b|(?:explanation|reasoning|why|step[- ]by[- ]step)\s*[*_]*:)")
# The words before a count of the reply's own parts, not of what the question asks about: "the two ways", "in two
# steps".
_OWN_PARTS = re.compile(r"(?i)\b(?:the|these|those|all|both|of|in|into|with|first|last|next|other)\s+\Z")
# A reply cut off mid-sentence (at max_tokens): it ends on an operator or a word no sentence ends on ("Now we multiply
# the", "Total = 48 +", "so"); not on a number, a unit, a closing "**" or a full stop.
_CUT_OFF = re.compile(r"(?:[-+=/\u2212\u00d7\u00f7(,:]|(?<!\*)\*|\\times|\\cdot|\b(?i:the|a|an|and|or|of|to|so|by|with|"
                      r"we|is|are|was|were|which|then|than|into|from|at|because|since|if|our|their|its|multiply|"
                      r"divide|add|subtract))\s*\Z")
_SCALE_END = re.compile(r"(?<=\d)(?:\s?(thousand|million|billion|trillion)|([kKMB]|bn))$")  # as _SCALE writes them
# A bold number and a unit of up to three words: "**72**", "**$10**", "**72 clips**"; not "**Step 1:**".
_BOLD_NUMBER = re.compile(r"(\*\*|__)\s*(" + _NUMBER + r")\s*(?:[a-zA-Z]+(?:[ \t]+[a-zA-Z]+){0,2})?\s*[.!]?\s*\1")
# A sentence that concludes with a number: "So she sold 72 in all.", "Therefore 72.", "Altogether, 72 clips."
_CONCLUDES = re.compile(r"(?i)\b(?:so|therefore|thus|hence|in total|altogether|in all|overall|combined)\b[^.!?]*\d")
_SENTENCE_END = re.compile(r"(?<=[!?])\s+|\.(?!\d)\s*|\n+")
# A total and what opens its parts: a colon, a parenthesis, a dash or ", with" after the number and a few words.
_OPENS_PARTS = re.compile(r"(" + _NUMBER + r")[^\d:(\u2014\u2013,]{0,40}?(?::|\(|\u2014|\u2013|\s-\s|,\s*with\b|"
                          r",\s*(?:which is|i\.e\.,?|that is,?|namely)\s|,(?=\s*[$\u20ac\u00a3]?\d))")
# Words that tell a working from a breakdown: "She has 5 apples. She gives away 2, so she has 3 left." is no 5.
_NOT_PARTS = re.compile(r"(?i)\b(?:so|therefore|thus|hence|altogether|overall|left|remain\w*|leaving|leaves|after|"
                        r"then|now|answer|result|total|gives?|gave|kept|keeps?|spent|spends?|loses?|lost)\b")
# What tells a total said first from a given: a total's word in its sentence, or a breakdown's opening after it
# ("That's 48 in April plus 24 in May.", "Breakdown: ...", "(48 in April, 24 in May.)"), or labelled lines under it.
_TOTAL_WORD = re.compile(r"(?i)\b(?:in total|altogether|in all|all together|combined|overall|total)\b")
_OPENS_BREAKDOWN = re.compile(r"(?i)\s*(?:that'?s|that is|this is|(?:here'?s |here is )?(?:the |a )?breakdown|"
                              r"here'?s how|which is|i\.e\.|namely|made up of|\()")
_LABELLED = re.compile(r"\s*[^:\n\d]{1,30}:\s*[*_]*\s*[-\u2212$\u20ac\u00a3]?\d")  # "April: 48", "**May:** 24"
_LIST_MARKER = re.compile(r"^[ \t]*(?:\d+[.)]|[-*+\u2022])[ \t]+", re.MULTILINE)  # "1. April: 48" is no part 1
# A price or size of each one, which multiplies the count before it: "9 eggs at $2 each", "9 sprints of 60 meters each".
_EACH = re.compile(r"\b(?:at|of)\s+(?=[$\u20ac\u00a3]?\d[\d,.]*(?:\s+[a-zA-Z]+){0,2}\s+(?:each|apiece)\b)")
_POWER = re.compile(r"\s?(?:x|\u00d7|\\times|\*)\s?10\s?\^\s?\{?([-+\u2212]?\d+)\}?$")
# A number past ~3,600 digits, or an exponent of four digits or more, is no answer: parse_number reads none (Python's
# int() refuses to spell one past 4,300 digits, and 10 ** 9999999 alone takes seconds).
_HUGE_EXPONENT = re.compile(r"(?:[eE]|\^\s?\{?)[-+\u2212]?\d{4,}")
_MAX_BITS = 12_000
# The working a total said first may be followed by: "70 left: 100 minus 30", "$600: 40 hours \u00d7 $15".
_OPERATOR = re.compile(r"(?i)(\bminus\b|\bless\b|\u2212|(?<!\w)-(?!\w)|\btake away\b)|(\btimes\b|\bmultiplied by\b|"
                       r"\u00d7|\*|\\times|\\cdot|\bx\b)|(\bdivided by\b|\u00f7)|(=|\bleav(?:es|ing)\b)")


def parse_number(text):
    """The number ``text`` spells (commas, currency, a fraction a/b, an exponent, a scale, a unicode minus allowed),
    or None. A one-character fraction is spelled a/b by the callers first (``spelled_fractions``)."""
    if text is None:
        return None
    text = str(text)
    return _remembered(text) if len(text) <= 64 else _parse(text)


@functools.lru_cache(maxsize=4096)
def _remembered(text):
    """``_parse`` of a short string, remembered: a run's replies and questions say the same numbers again and again."""
    return _parse(text)


def _parse(text):
    cleaned = text.strip().replace("\u2212", "-")
    if _HUGE_EXPONENT.search(cleaned):
        return None  # "1e99999", "10^{100000}": no answer, and a number int() could not even spell
    exponent = 0
    power = _POWER.search(cleaned)
    if power:
        exponent, cleaned = int(power.group(1).replace("\u2212", "-")), cleaned[:power.start()]
    scale = _SCALE_END.search(cleaned)
    if scale:
        exponent, cleaned = exponent + _SCALES[(scale.group(1) or scale.group(2)).lower()], cleaned[:scale.start()]
    cleaned = re.sub(r"USD|EUR|[$\u20ac\u00a3\u00a5,\s]", "", cleaned).rstrip(".").rstrip("%")
    if cleaned.startswith("--"):
        cleaned = cleaned[1:]
    try:
        if "/" in cleaned:
            num, den = cleaned.split("/", 1)
            value = Fraction(num.strip("()")) / Fraction(den.strip("()"))
        else:
            value = Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None
    scaled = value * Fraction(10) ** exponent
    if max(scaled.numerator.bit_length(), scaled.denominator.bit_length()) > _MAX_BITS:
        return None
    return _Scaled(scaled, value) if scale else scaled


class _Scaled(Fraction):
    """A number with a second reading: one written with a scale ("1.5 million"), whose ``other`` reading is the number
    before the scale (what a question asking "how many million..." has as its reference), or a quantity written in
    two units ("2 hours and 30 minutes": 150, in its smaller unit), whose other reading is in its larger unit (2.5)."""

    other: Fraction

    def __new__(cls, value, other):
        self = super().__new__(cls, value)
        self.other = other
        return self


def same_number(answer, expected):
    """Whether the reply's number is the reference's: equal, or equal in either one's other reading ("$1.5 million" for
    a reference of 1.5 when the question counts in millions, "1.5" for a reference of "1.5 million"; "2 hours and 30
    minutes" for a reference of 150 or of 2.5)."""
    if answer is None or expected is None:
        return False
    return (answer == expected or getattr(answer, "other", None) == expected
            or answer == getattr(expected, "other", None))


def _last_number(text):
    numbers = _NUMBER_RE.findall(text)
    return parse_number(numbers[-1]) if numbers else None


def extract_answer(reply):
    """The final numeric answer in a free-text reply, as a Fraction, or None."""
    return find_answer(reply)[0]


def find_answer(reply, question=None):
    """(value, rule) for the reply's final numeric answer; (None, None) when it gives none. Only the answer part is
    read (a reasoning block is skipped); after a self-correction ("41... wait, 42") the corrected part wins.
    ``question``: the prompt, when known; a question that asks for a total ("How many ... altogether?") tells a total
    said first from a given ("She sold 72 clips. In April she sold 48 and in May 24.")."""
    text, readings = spelled_compounds(spelled_fractions(plain_apostrophes(answer_part(reply, tags=True))))
    if not text.strip():
        return None, None
    tail = after_correction(text)
    value, rule = _find(tail, question) if tail is not None else (None, None)
    if value is None:
        value, rule = _find(text, question)
    if value is None:
        return None, None  # a rule found a number it could not read ("111...1" past int()'s 4,300 digits)
    if value in readings and not isinstance(value, _Scaled):
        value = _Scaled(value, readings[value])
    return value, rule


def _find(text, question=None):
    found = _HASHES.findall(unlatex(text))
    if found:  # "#### 72"
        return parse_number(found[-1]), "hashes"
    for inner in reversed(boxed(text)):  # \boxed{\frac{3}{4}}, \boxed{\$1{,}234}
        inner = unlatex(inner).replace("{", "").replace("}", "")
        value = parse_number(inner)
        if value is None:
            value = _last_number(inner)
        if value is not None:
            return value, "boxed"
    for item in reversed(json_answers(text)):  # {"answer": 72}
        value = parse_number(str(item))
        if value is None:
            value = _last_number(str(item))
        if value is not None:
            return value, "json"
    plain = unlatex(text)
    found = [m for m in _ANSWER_IS.finditer(plain) if not _total_said_first(plain, m)]
    last = found[-1] if found else None
    if last and _cut_off(plain) and _OPENS_WORKING.match(plain, last.end(1)) and not _CLAUSE_END.search(
            plain, last.end(1)) and _worked_out(last.group(1), plain[last.end(1):]) == last.group(1):
        found.pop()  # the reply was cut off in the working this one opens: "**Step 3:** Total = 48 +" says no 48
    if found:  # "The answer is 18", "**Final answer:** $1,234", the last one said
        return parse_number(_worked_out(found[-1].group(1), plain[found[-1].end(1):])), "answer_phrase"
    lead = _LEADING.match(plain)
    if lead and not re.search(r"^\s*2[.)]\s", plain, re.MULTILINE):  # not "1." of a numbered list of steps
        # "72. I got there by adding the 2 parts." (the answer first, an explanation after)
        return parse_number(lead.group(1)), "leading_number"
    said = without_closing(plain)
    value = _bold_result(said, question)
    if value is not None:
        return value, "bold"
    value = _total_and_parts(said, question)
    if value is not None:
        return value, "total_and_parts"
    if _cut_off(said):
        return None, None  # "... 5. Price per egg: $2\n\nNow we multiply the": its last number is no answer
    kept = _outside_asides(_without_afterword(said, question))
    value = _spelled_result(kept, question)
    if value is not None:
        return value, "number_words"
    value = _last_unrestated(kept, question)
    if value is None:
        value = _last_number(plain)
    if value is not None:
        return value, "last_number"
    value = _last_word_number(plain)
    return (value, "number_words") if value is not None else (None, None)


def _cut_off(text):
    """Whether ``text`` ends mid-sentence (``_CUT_OFF``), read from its last characters only."""
    return _CUT_OFF.search(text.rstrip()[-64:]) is not None


def _outside_asides(text):
    """``text`` without its asides (``_ASIDES``) and without each parenthetical that explains the number said before it
    with two numbers or more: "So she makes $18 per day. (That's 16 - 3 - 4 = 9 eggs sold at $2 each.)", "25% ($20
    off the original $80)", "-7\u00b0C (12 degrees below the noon reading of 5\u00b0C)". Not one that says a result: a
    working's result at its end ("(3 \u00d7 24 = 72)", "(= 72)"), one number ("(150 minutes)", "(i.e., 72)"), or a
    conclusion ("(so 18 in all)"). And without a closing note that concludes nothing ("_Note: this assumes she sells
    all 9 remaining eggs._")."""

    def aside(m):
        inner = m.group(1)
        if (len(_NUMBER_RE.findall(inner)) < 2 or _RESULT_WORD.search(inner)
                or ("=" in inner and _LONE.match(inner.rsplit("=", 1)[1].rstrip(" .")))):
            return m.group(0)
        return " "

    note = _NOTE.search(text)
    if note is not None and not _CONCLUDES.search(note.group(0)):  # a closing note; not one that concludes ("so $18")
        text = text[:note.start()]
    return _PAREN.sub(aside, _ASIDES.sub(" ", text))


@functools.lru_cache(maxsize=8)
def _givens(question):
    """The numbers the question states, in digits or words ("16 eggs", "three for breakfast"): what a reply restates."""
    words = {_last_word_number(m.group(0)) for m in _WORD_NUMBER.finditer(question or "")}
    return frozenset(set(_given_words(question)) | words)  # the digits' values read once, with their next words


def _without_afterword(text, question=None):
    """``text`` without what follows its answer and brings no number of its own: a check or an explanation after it
    (``_AFTERWORD``) whose numbers are all said before it or given by the question ("... so she makes $18 per day.
    Check: 9 \u00d7 2 = 18 \u2713 and 3 + 4 + 9 = 16 \u2713"; "... for a total of 72 clips. That is 48 in April plus 24
    in May."), or that works out the number said before it ("540 meters a week. That's 9 sprints of 60 meters each.");
    and closing sentences that restate two or more of the question's givens and nothing else ("Janet makes $18 every
    day. Her ducks lay 16 eggs, she eats 3 and bakes with 4, and she sells each for $2."), or one given in a sentence
    that says the question's own again ("... which is $18. Her ducks lay 16 eggs per day."). Not a check that finds a
    new number ("... 16. Check: 9 \u00d7 2 = 18, not 16" is 16), nor a last sentence that says one given ("... so she
    sold 48 in April."), nor one that says a working's result ("She sells 9 eggs at $2 each. That's $18.")."""
    scan = _LIST_MARKER.sub(lambda m: " " * len(m.group(0)), text)  # "1. Sprints per session: 3" has no number 1
    if not _AFTERWORD.search(scan) and len(_SENTENCE_END.split(scan.strip(" \t\n.!?*_"), maxsplit=1)) < 2:
        return text  # one sentence and no check: nothing follows the answer (and no number need be read)
    found = list(islice(_NUMBER_RE.finditer(scan), 2001))
    if not 2 <= len(found) <= 2000:  # nothing to drop; or no reply a model writes
        return text
    numbers = [(m.start(), parse_number(m.group(0))) for m in found]
    givens = _givens(question)
    cut = len(text)
    for marker in list(_AFTERWORD.finditer(scan, numbers[0][0]))[::-1][:5]:  # the last ones, the earliest cut kept
        before = [value for at, value in numbers if at < marker.start()]
        after = [value for at, value in numbers if marker.start() <= at < cut]
        if before and not (set(after) <= set(before) | givens or _comes_to(scan[marker.start():cut], before[-1])):
            break
        cut = marker.start() if before else cut
    last, restated, kept, end = sum(at < cut for at, _ in numbers) - 1, 0, cut, cut
    for sentence in reversed([0, *(m.end() for m in _SENTENCE_END.finditer(scan, 0, cut))]):
        piece = scan[sentence:end]
        if end - sentence > 1000 or _CONCLUDES.search(scan, sentence, end):  # "So 5 red and 7 blue become 5.": a
            break  # conclusion, not a restatement (and a run-on "sentence" is no restatement either)
        while last >= 0 and numbers[last][0] >= sentence and restated <= 40:  # the closing sentences' numbers
            if numbers[last][1] not in givens:
                return text[:kept]
            last, restated = last - 1, restated + 1
        end = sentence
        if last < 0 or restated > 40:  # nothing said before them: they may well hold the answer
            break
        if restated >= 2 or (restated and _echoes(piece, question)):
            kept = sentence
    return text[:kept]


def _echoes(sentence, question):
    """Whether ``sentence`` says a sentence of the question again, nearly word for word: at least four words, all but
    one of them the question's ("Her ducks lay 16 eggs per day." after the answer to Janet's question)."""
    words = re.findall(r"[a-z0-9]+", sentence.lower())
    asked = set(re.findall(r"[a-z0-9]+", (question or "").lower()))
    return len(words) >= 4 and sum(word not in asked for word in words) <= 1


def _bold_result(text, question=None):
    """The reply's bold number, the way chat models mark their result ("Natalia sold **72 clips** altogether: 48 in
    April and 24 in May."), when it bolds one value only and no later sentence concludes with a number of its own
    ("In April she sold **48**. So she sold 72 in all." is 72: the last number rule's); not a given of the question in
    a sentence that says the question's own again ("Janet's ducks lay **16 eggs** a day. ... she makes $18.")."""
    found = list(_BOLD_NUMBER.finditer(text))
    values = {parse_number(m.group(2)) for m in found}
    if len(values) != 1 or None in values:
        return None
    if next(iter(values)) in _givens(question) and _echoes(text[slice(*_sentence_at(text, found[0]))], question):
        return None
    if any(_CONCLUDES.search(s) for s in _SENTENCE_END.split(text[found[-1].end():])[1:]):  # sentences after its
        return None
    return values.pop()


def _sentence_at(text, m):
    """Where the sentence of ``text`` that match ``m`` is in starts and ends (looking back 1,000 characters at most)."""
    starts = [e.end() for e in _SENTENCE_END.finditer(text, max(0, m.start() - 1000), m.start())]
    end = _SENTENCE_END.search(text, m.end())
    return starts[-1] if starts else max(0, m.start() - 1000), end.start() if end else len(text)


def _total_said_first(text, m):
    """Whether answer phrase ``m`` is "in total:" after a number of its sentence, its parts after the colon: "It takes
    3 bolts in total: 2 of blue and 1 of white." (the total and its parts rule's, not 2)."""
    return text[max(0, m.start() - 3):m.start()].lower() == "in " and _NUMBER_RE.search(
        text, _sentence_at(text, m)[0], m.start()) is not None


def _last_unrestated(text, question=None):
    """``text``'s last number, before a closing clause that compares it with a given (``_COMPARED``); but when its last
    sentence says the question's givens again with the question's word after them ("50 minutes"), the number before
    them the question does not give: "Weng earned $10 for 50 minutes of babysitting." is 10."""
    compared = _COMPARED.search(text, max(0, len(text) - 300))
    cut, clause = (compared.start(), compared.group(0)) if compared is not None else (0, "")
    if clause and _NUMBER_RE.search(text, 0, cut) and (_BY_HOW_MUCH.match(clause) or any(
            parse_number(n) in _givens(question) for n in _NUMBER_RE.findall(clause))):
        text = text[:cut]  # "$20, $5 less than its $25 price", "$20, $5 less than its price": 20
    found = list(_NUMBER_RE.finditer(text, max(0, len(text) - 2000)))
    if not found:
        return _last_number(text)
    start, _ = _sentence_at(text, found[-1])
    said = _given_words(question)
    for m in reversed(found):
        value = parse_number(m.group(0))
        if m.start() < start:
            break
        if value not in said:
            return value  # the last number the question does not give
        word = re.match(r"[\s$]*([a-zA-Z]+)", text[m.end():m.end() + 40])
        if word is None or word.group(1).lower() not in said[value]:
            break  # a given said otherwise ("Finally, 7 are left."): it may be the answer
    return parse_number(found[-1].group(0))


@functools.lru_cache(maxsize=8)
def _given_words(question):
    """Each number the question states and the words right after it ("50 minutes of": 50 -> {"minutes"})."""
    said: dict = {}
    for m in islice(_NUMBER_RE.finditer(question or ""), 200):
        word = re.match(r"[\s$]*([a-zA-Z]+)", question[m.end():m.end() + 40])
        said.setdefault(parse_number(m.group(0)), set()).add(word.group(1).lower() if word else "")
    return said


def _total_and_parts(text, question=None):
    """A total said first and its parts or working after it: in the reply's first sentence ("She sold 72 clips: 48 in
    April and 24 in May.", "72 clips in all (48 in April, 24 in May)", "72, which is 48 + 24"), or, when that sentence
    holds no other number, in the rest of the reply ("She sold 72 clips. Breakdown: April 48, May 24.", a list of the
    parts under it); the parts must come to the total exactly (``_comes_to``), and not be a working that goes on from
    it ("She has 5 apples. She gives away 2, so she has 3 left." is 3: ``_NOT_PARTS``). A first sentence with no
    total's word is a total when the question asks for one ("How many clips did Natalia sell altogether?")."""
    first, *rest = _SENTENCE_END.split(text.strip(), 1)
    opened = _OPENS_PARTS.search(first)
    # a bare comma opens parts only where no working goes on after it ("She had 5, gave away 2 and kept 3.")
    if opened is not None and not (first[opened.end() - 1] == "," and _NOT_PARTS.search(first, opened.end())):
        total = parse_number(opened.group(1))
        if total is not None and _comes_to(first[opened.end():], total):
            return total
    said = _NUMBER_RE.findall(first)
    if len(said) != 1 or not rest:
        return None
    if not (_TOTAL_WORD.search(first) or _OPENS_BREAKDOWN.match(rest[0]) or _TOTAL_WORD.search(question or "")
            or all(_LABELLED.match(line) for line in _LIST_MARKER.sub("", rest[0]).splitlines() if line.strip())):
        return None  # "There were 10 birds. 4 flew off and 6 stayed." is no total and its parts
    breakdown = _LIST_MARKER.sub(" ", rest[0])
    if _NOT_PARTS.search(breakdown):
        return None
    total = parse_number(said[0])
    return total if total is not None and _comes_to(breakdown, total) else None


def _comes_to(working, total):
    """Whether the numbers in ``working`` (two or more) come to ``total``: added up ("48 in April and 24 in May"), or
    combined by the operators written between them, multiplying and dividing first ("100 minus 30", "40 hours \u00d7
    $15 an hour", "24 \u00f7 3", "9 sprints of 60 meters each"); an "=" ends the working."""
    working = _EACH.sub("\u00d7 ", working)  # "9 sprints of 60 meters each": 9 \u00d7 60
    terms, count, at = [Fraction(0)], 0, 0  # a sum of products, each multiplied or divided in place
    for m in _NUMBER_RE.finditer(working):
        value = parse_number(m.group(0))
        operator = _OPERATOR.search(working, at, m.start()) if count else None
        at = m.end()
        if value is None:
            return False
        if operator is not None and operator.lastindex == 4:  # "= 72", "leaves 9": the working's own result
            if sum(terms) != value or sum(terms) == total:
                break
            terms = [value]  # a step's result the working goes on from: "16 minus 7 leaves 9, at $2 apiece"
            continue
        count += 1
        if count > 100:  # no breakdown a model writes (and 200 KB of "(1 2 " would take seconds to add up)
            return False
        if operator is not None and operator.lastindex in (2, 3):
            if operator.lastindex == 3 and value == 0:
                return False
            terms[-1] = terms[-1] * value if operator.lastindex == 2 else terms[-1] / value
        else:
            terms.append(-value if operator is not None and operator.lastindex == 1 else value)
    return count >= 2 and sum(terms) == total


def _spelled_result(text, question=None):
    """The count spelled out in the reply's last sentence, when that sentence has no digits and one such count, of
    what the question asks about (the word after it is one of the question's: "She sells 9 eggs. She makes eighteen
    dollars a day." for "How much in dollars ...?"); None else. Not "one" (prose is full of it), nor a count of the
    reply's own parts ("There are two ways to check this.", "in two steps", "the two methods agree")."""
    last = _SENTENCE_END.split(text.rstrip(" \t\n*_.!"))[-1]
    if not question or re.search(r"\d", last):
        return None
    asked = {word.rstrip("s") for word in re.findall(r"[a-z]+", question.lower())}  # "dollars" counts "dollar"

    def counts_asked(m):
        noun = re.match(r"[ \t]+([a-zA-Z]+)", last[m.end():])
        return (noun is not None and noun.group(1).lower().rstrip("s") in asked
                and (m.group(3) or "").lower() not in ("one", "zero")
                and not _OWN_PARTS.search(last, max(0, m.start() - 12), m.start()))

    counts = [m for m in _WORD_NUMBER.finditer(last) if counts_asked(m)]
    return _last_word_number(counts[0].group(0)) if len(counts) == 1 else None


def _last_word_number(text):
    """The last count spelled out in ``text`` (0-99), or None. "one" counts only as the whole reply: prose is full of
    it ("no one", "one of them", "give one more detail" in a refusal)."""
    value = None
    for m in _WORD_NUMBER.finditer(text):
        if m.group(3) and m.group(3).lower() == "one" and (text[:m.start()] + text[m.end():]).strip(" \t\n*_.!"):
            continue
        if m.group(1):
            value = 20 + 10 * _TENS.index(m.group(1).lower()) + (_UNITS.index(m.group(2).lower()) if m.group(2) else 0)
        else:
            value = _UNITS.index(m.group(3).lower())
    return None if value is None else Fraction(value)


def _worked_out(number, rest):
    """The result of the working that ``number`` opens (``rest``: the text after it), or ``number`` itself when it
    opens none: "60 + 12 = **72**." gives "72"."""
    if not _OPENS_WORKING.match(rest):
        return number
    end = _CLAUSE_END.search(rest)
    sides = (number + (rest[:end.start()] if end else rest)).split("=")
    if len(sides) > 1:
        for side in reversed(sides):
            lone = _LONE.match(side)
            if lone:
                return lone.group(1)
    return number


def reference_number(reference):
    """The reference's number: after its last '####' when it has one, else the whole value (else its last number)."""
    text = spelled_fractions(str(reference))
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

    def one_call(self, row):
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self.extract(row)},
        ]

    def solve(self, row, call_sut):
        return call_sut(self.one_call(row))

    def score(self, row, response):
        expected = reference_number(row[CONFIG["reference"]])
        if expected is None:
            raise ValueError(f"reference {row[CONFIG['reference']]!r} holds no number")
        answer, rule = find_answer(response, self.extract(row))
        return {"score": 1.0 if same_number(answer, expected) else 0.0, "answer": spell(answer),
                "reference": spell(expected), "extracted": answer is not None, "rule": rule}
