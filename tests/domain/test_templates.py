"""The builtin driver's scorer templates: each rendered exactly as Atomize writes it, exec'd, and its extractor and
scorer called on tricky replies; and template selection from columns and sample rows."""

from __future__ import annotations

import json
import random
import re
import time
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar

import pytest

from benchwright.drivers import DriverFailed, ScorerPlan
from benchwright.drivers.templates import TEMPLATE_FILES, render_plan, select_template
from benchwright.scoring.runner import MAX_OUTPUT_CHARS, SutText, output_of


def _load(plan: ScorerPlan, **kw: Any) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "task_impl"}
    exec(compile(render_plan(plan, **kw), "task_impl.py", "exec"), ns)  # the file under test
    return ns


NUMERIC = _load(ScorerPlan(template="numeric", fields={"input": "question", "reference": "answer"}, why=""))
CHOICE = _load(ScorerPlan(template="multiple_choice",
                          fields={"input": "question", "reference": "answer", "choices": "choices"}, why=""))
EXACT = _load(ScorerPlan(template="exact_match", fields={"input": "question", "reference": "answer"}, why=""))


@pytest.mark.parametrize(("reply", "expected"), [
    ("I think it's 42, no wait, 41", Fraction(41)),
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", Fraction(72)),
    ("So the total is \\boxed{1,234}.", Fraction(1234)),
    ("The answer is $1,234.00.", Fraction(1234)),
    ("The temperature dropped to -7 degrees, so the answer is -7.", Fraction(-7)),
    ("It costs 3.75 dollars", Fraction("3.75")),
    ("\\boxed{\\frac{3}{4}}", Fraction(3, 4)),
    ("Answer: 18 (after 3 steps of 6)", Fraction(18)),
    ("#### 5\nLet me double-check: 2 + 3 = 5 and 10 more is 15", Fraction(5)),
    ("I don't know.", None),
    ("The result is \u22125", Fraction(-5)),
])
def test_numeric_extracts_the_final_answer(reply: str, expected: Fraction | None) -> None:
    assert NUMERIC["extract_answer"](reply) == expected


@pytest.mark.parametrize(("reference", "reply", "score"), [
    ("Janet has 16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18", "She makes $18 every day.", 1.0),
    ("#### 1,234", "1234.0", 1.0),
    ("1234", "The answer is 1,234", 1.0),
    ("0.5", "\\boxed{1/2}", 1.0),
    ("#### 18", "She makes 17 dollars, wait, 81.", 0.0),
    ("42", "no idea", 0.0),
])
def test_numeric_scores_numerically_and_records_the_answer(reference: str, reply: str, score: float) -> None:
    result = NUMERIC["Scorer"]().score({"question": "q", "answer": reference}, reply)
    assert result["score"] == score
    assert result["answer"] == NUMERIC["spell"](NUMERIC["extract_answer"](reply))


@pytest.mark.parametrize(("reply", "value"), [
    ("3½ cups", "7/2"), ("a ½ cup", "1/2"), ("-¾", "-3/4"), ("2 ⅓", "7/3"), ("$4½", "9/2"), ("1,234½", "2469/2"),
    ("The answer is 1⅛.", "9/8"),
])
def test_numeric_reads_a_fraction_written_as_one_character(reply: str, value: str) -> None:
    assert NUMERIC["extract_answer"](reply) == Fraction(value)


@pytest.mark.parametrize(("reply", "value", "other"), [
    ("2 hours and 30 minutes", "150", "5/2"), ("1 h 15 min", "75", "5/4"), ("2h30m", "150", "5/2"),
    ("5 feet, 6 inches", "66", "11/2"), ("3 min 20 s", "200", "10/3"), ("1 minute 30.5 seconds", "181/2", "181/120"),
    ("1 km 500 m", "1500", "3/2"), ("2 weeks and 3 days", "17", "17/7"), ("5 dollars and 25 cents", "525", "21/4"),
])
def test_numeric_reads_a_quantity_written_in_two_units_in_either(reply: str, value: str, other: str) -> None:
    answer = NUMERIC["extract_answer"](reply)
    assert (answer, answer.other) == (Fraction(value), Fraction(other))
    assert NUMERIC["same_number"](answer, Fraction(value)) and NUMERIC["same_number"](answer, Fraction(other))
    assert not NUMERIC["same_number"](answer, Fraction(value) + 1)


@pytest.mark.parametrize(("reply", "value"), [
    ("3 days and 30 hours", "30"),  # the smaller part is no fraction of the larger: two quantities
    ("2 hours and 30 km", "30"), ("3 boxes and 24 apples", "24"), ("2 km 30 minutes", "30"),
])
def test_numeric_leaves_two_quantities_that_are_not_one(reply: str, value: str) -> None:
    answer = NUMERIC["extract_answer"](reply)
    assert answer == Fraction(value) and not hasattr(answer, "other")


@pytest.mark.parametrize(("working", "total", "comes_to"), [
    ("48 in April and 24 in May", "72", True), ("100 minus 30", "70", True), ("100 - 30", "70", True),
    ("40 hours × $15", "600", True), ("2 + 3 × 4", "14", True), ("24 ÷ 3", "8", True), ("$20 ÷ $80 × 100", "25", True),
    ("100 minus 30 = 70, as said", "70", True), ("100 minus 30", "130", False), ("40 hours × $15", "55", False),
    ("70", "70", False),  # one number is no working
    ("5 divided by 0", "5", False),
])
def test_numeric_works_out_the_working_after_a_total(working: str, total: str, comes_to: bool) -> None:
    assert NUMERIC["_comes_to"](working, Fraction(total)) is comes_to


@pytest.mark.parametrize(("reply", "value"), [
    ("She sold 72 clips. Breakdown: April 48, May 24.", "72"),
    ("She has 5 apples. She gives away 2, so she has 3 left.", "3"),  # a working that goes on from a given
    ("She has 5 apples. After giving 2 away, 3 remain.", "3"),
    ("She had 5 apples, gave away 2 and kept 3.", "3"),
    ("There were 10 birds. 4 flew off and 6 stayed.", "6"),  # no total's word, no breakdown: a given
    ("Tom is 12. His sister is 5 years younger, so she is 7.", "7"),
])
def test_numeric_tells_a_total_and_its_breakdown_from_a_given_and_its_working(reply: str, value: str) -> None:
    assert NUMERIC["extract_answer"](reply) == Fraction(value)


@pytest.mark.parametrize(("question", "reply", "value"), [
    # a question that asks for a total tells a total said first from a given
    ("How many clips did Natalia sell altogether in April and May?",
     "Natalia sold 72 clips. In April she sold 48 and in May 24.", "72"),
    ("How many birds stayed?", "There were 10 birds. 4 flew off and 6 stayed.", "6"),
    ("How many apples does she have left in total?", "She has 5 apples. She gives away 2, so she has 3 left.", "3"),
])
def test_numeric_reads_a_total_the_question_asks_for(question: str, reply: str, value: str) -> None:
    assert NUMERIC["find_answer"](reply, question)[0] == Fraction(value)


@pytest.mark.parametrize("reply", ["1" * 5000 + " hours and 30 minutes", "2 hours and " + "3" * 5000 + " minutes",
                                   "She sold " + "7" * 5000 + " clips: 48 in April and 24 in May.",
                                   "1" * 5000 + "\u00bd", "1" * 5000, "1e99999", "6 \u00d7 10^{99999}",
                                   "7e" + "9" * 5000])
def test_numeric_reads_a_hostile_run_of_digits_without_failing(reply: str) -> None:
    """Python's int() refuses more than 4,300 digits: such a reply is read as no number or another, never an error,
    and a rule that found digits it could not read is not named as the rule that read the answer."""
    result = NUMERIC["Scorer"]().score({"question": "q", "answer": "30"}, reply)
    assert result["score"] in (0.0, 1.0) and (result["rule"] is None) == (result["answer"] is None)


HOSTILE_PIECES = [
    "9" * 5000, "\u00bd", " hours and ", " minutes", ": ", " minus ", " \u00d7 ", " \u00f7 0", "=", "\n- A: \u2705",
    "**", "$", "1e99999", " \u00d7 10^{99999}", "\\boxed{", "}", '{"answer": ', "<tool_call>", "call:x{a:",
    "<function=x>", "<parameter=a>", "</parameter>", "</function>", "November 9, ", "It was ", " who ", "seven",
    " continents", "Final Answer: The final answer is ", "Confidence: ", "%", "(", ")", "<think>", "</think>", " 10^",
    "1/0", "0/0", "NaN", "Infinity", "\u00a0", "\t", "\u2192", " = ", "Breakdown: ", "That's ", "\u2212", "-", ".",
    ",", "1,234\u00bd", "1" * 20,
]


def test_no_reply_fails_a_templates_score() -> None:
    """A model's reply is the scorer's input, never its failure: 300 replies pieced together from what broke the
    templates once (a run of digits past int()'s 4,300, an exponent of 99,999, a division by zero, unclosed markup)
    are each scored by the numeric, multiple-choice, exact-match and tool-call templates without an exception."""
    samples = Path(__file__).resolve().parents[2] / "benchwright" / "samples"
    tool_row = json.loads((samples / "toolcall-mini.jsonl").read_text().splitlines()[0])
    tool = _load(ScorerPlan(template="tool_call",
                            fields={"input": "question", "functions": "function", "reference": "ground_truth"}, why=""))
    scorers = [(NUMERIC, {"question": "How many?", "answer": "72"}),
               (CHOICE, {"question": "q", "choices": ["0", "1", "2", "3"], "answer": 1}),
               (EXACT, {"question": "In which year did the Berlin Wall fall?", "answer": "1989"}), (tool, tool_row)]
    pick = random.Random(7)
    for _ in range(300):
        reply = "".join(pick.choice(HOSTILE_PIECES) for _ in range(pick.randint(1, 12)))
        for ns, row in scorers:
            assert ns["Scorer"]().score(row, reply)["score"] in (0.0, 1.0)


def test_numeric_reference_without_a_number_is_an_error_not_a_zero() -> None:
    with pytest.raises(ValueError, match="holds no number"):
        NUMERIC["Scorer"]().score({"question": "q", "answer": "unknown"}, "4")


CHOICES = ["Paris", "London", "Berlin", "Madrid"]


@pytest.mark.parametrize(("reply", "letter"), [
    ("The answer is **B**.", "B"),
    ("(B)", "B"),
    ("B) London is the capital of the UK.", "B"),
    ("Answer: b", "B"),
    ("b", "B"),
    ("**C**", "C"),
    ("I'd go with the answer is C because Berlin is in Germany. (A) is tempting.", "C"),
    ("The capital is Madrid.", "D"),
    ("Option D", None),  # no verb: not an answer phrase, but "D" stands alone
    ("The answer is a bit unclear; I would say London.", "B"),
    ("I cannot decide between A and B.", None),
    ("", None),
])
def test_choice_extracts_the_letter_robustly(reply: str, letter: str | None) -> None:
    expected = "D" if reply == "Option D" else letter
    assert CHOICE["extract_letter"](reply, CHOICES) == expected


@pytest.mark.parametrize(("reply", "letter"), [
    # several letters named: the one in the last clause, the one an elimination leaves, the only one that fits
    ("Although Berlin (C) is a capital too, the capital of the UK is London (B).", "B"),
    ("Hmm, C is Berlin, which is a capital, but B (London) is the UK's.", "B"),
    ("While A and C are capitals, B is the UK's.", "B"),
    ("Let me go through the options. (A) Paris \u2013 France. (C) Berlin \u2013 Germany. That leaves (B) London.", "B"),
    ("Among A, B, C and D, only B fits.", "B"),
    # ... not a clause that denies, nor two letters left, nor a short reply that doubts its one letter
    ("A is close, but B is wrong.", None),
    ("While A is possible, C and D are not.", None),
    ("That leaves A and B.", None),
    ("Only A is wrong.", None),
    ("Although B looks tempting, it isn't right.", None),
    ("Although many pick C, I'm unsure.", None),
    # a lower-case letter in brackets after "option", said to be right; not one said not to be
    ("I believe option (b) is right.", "B"),
    ("Not option (b) is right.", None),
    # a short reply's one letter past the letters it denies or sets aside; none when it denies them all
    ("B, not C.", "B"),
    ("Not A. B.", "B"),
    ("B (though C is close).", "B"),
    ("Not A, not B.", None),
    ("Only A is wrong.", None),
])
def test_choice_reads_the_last_clause_and_an_elimination(reply: str, letter: str | None) -> None:
    assert CHOICE["extract_letter"](reply, CHOICES) == letter


@pytest.mark.parametrize(("row", "letter"), [
    ({"question": "q", "choices": CHOICES, "answer": 1}, "B"),
    ({"question": "q", "choices": CHOICES, "answer": "2"}, "C"),
    ({"question": "q", "choices": CHOICES, "answer": "d"}, "D"),
    ({"question": "q", "choices": {"text": CHOICES, "label": ["1", "2", "3", "4"]}, "answer": "4"}, "D"),
    ({"question": "q", "choices": json.dumps(CHOICES), "answer": "Paris"}, "A"),
])
def test_choice_reads_every_reference_form(row: dict[str, Any], letter: str) -> None:
    assert CHOICE["reference_letter"](row) == letter


@pytest.mark.parametrize(("reply", "choices", "letter"), [
    ("- A: ❌\n- B: ✅\n- C: ❌", CHOICES, "B"),
    ("A: no. B: yes. C: no.", CHOICES, "B"),
    ("A) Paris is not correct. B) London is correct.", CHOICES, "B"),
    ("| A | True, False ❌ |\n| B | ✅ |", CHOICES, "B"),  # a mark outweighs the words beside it
    ("A. Paris\nB. London\nC. Berlin\nD. Madrid", CHOICES, None),  # the options listed, none judged
    ("A. Yes\nB. No", ["Yes", "No"], None),  # the options listed: "Yes" is A's text, not a verdict
    ("A. No\nB. Yes", ["Yes", "No"], "B"),  # each word another option's text: read as verdicts
    ("- A: ✅\n- B: ✅\n- C: ❌", CHOICES, None),  # two ticked
    ("- A: ❌\n- E: ✅", CHOICES, None),  # no option E
    # each option a heading, its verdict opening the line below it
    ("### Option A: Paris\n❌ Incorrect\n\n### Option B: London\n✅ Correct — the capital.", CHOICES, "B"),
    ("**Option A**\nWrong.\n\n**Option B**\nCorrect, as the question asks.", CHOICES, "B"),
    ("### Option A: Paris\nNo other city is older.\n\n### Option B: London\nNo.", CHOICES, None),  # no verdict
    # a sentence after the option's text that says its verdict first
    ("A. Paris - This is incorrect because it is in France.\nB. London - This is correct.", CHOICES, "B"),
    ("A. Paris - It is true that Paris is large.\nB. London - It is big.", CHOICES, None),
])
def test_choice_reads_the_one_option_a_review_ticks(reply: str, choices: list[str], letter: str | None) -> None:
    assert CHOICE["_ticked_option"](reply, choices) == letter
    if letter is not None:
        assert CHOICE["find_letter"](reply, choices) == (letter, "verdicts")


PLANETS = ["Earth", "Jupiter", "Saturn", "Mars"]
RULINGS = ["Once a church has been recognized, its tax-exempt status can never be revoked.",
           "State-sponsored prayer is prohibited, but voluntary prayer before school is allowed."]


@pytest.mark.parametrize(("reply", "choices", "letter"), [
    # a choice's text in a clause that denies it is no answer (each read C, a false right for C, before)
    ("Saturn isn't it.", PLANETS, None),
    ("I don't think it's Saturn.", PLANETS, None),
    ("Saturn is not the largest planet.", PLANETS, None),
    ("C is Saturn, but it is not the largest.", PLANETS, None),
    ("Saturn is big. It has rings, but it is not the largest.", PLANETS, None),
    ("Many people think Saturn.", PLANETS, None),
    # a choice ranked after the answer is set beside it
    ("Jupiter is the largest, followed by Saturn.", PLANETS, "B"),
    ("Jupiter is the largest planet, well ahead of Saturn.", PLANETS, "B"),
    # the one text left when the others are denied or set aside
    ("Saturn is not the largest planet; that would be Jupiter.", PLANETS, "B"),
    ("Definitely not Jupiter \u2014 it's Saturn.", PLANETS, "C"),
    ("Jupiter is the largest, not Saturn.", PLANETS, "B"),
    ("Saturn? No. Jupiter.", PLANETS, "B"),
    ("Many people think Saturn, but it's actually Jupiter.", PLANETS, "B"),
    ("Although Saturn is huge, Jupiter is bigger.", PLANETS, "B"),
    ("Jupiter. Saturn is the second largest.", PLANETS, "B"),
    # words that only look like a denial
    ("Jupiter, no doubt.", PLANETS, "B"),
    ("Jupiter is not only the largest planet, it is the most massive.", PLANETS, "B"),
    ("Jupiter. Not Saturn.", PLANETS, "B"),
    # a choice's own words never deny it: "never" and "but" are the second ruling's text
    ("It's the first one: once a church has been recognized, its tax-exempt status can never be revoked.", RULINGS,
     "A"),
    ("State-sponsored prayer is prohibited, but voluntary prayer before school is allowed.", RULINGS, "B"),
    # two texts, neither denied: no answer
    ("Jupiter and Saturn are both gas giants.", PLANETS, None),
    # the one letter after an opening "Between ..." clause, not one the clause denies
    ("It's definitely not A or D. Between B and C, B is larger.", PLANETS, "B"),
    ("Between B and C, neither is right.", PLANETS, None),
])
def test_choice_text_a_reply_denies_is_no_answer(reply: str, choices: list[str], letter: str | None) -> None:
    assert CHOICE["extract_letter"](reply, choices) == letter


@pytest.mark.parametrize(("reply", "letter"), [
    ("C is Saturn, but it is not the largest.", None),  # "but" denies what the question asks: no answer
    ("C is Saturn, but it isn't the answer.", None),  # ... or that it is the answer
    ("Jupiter is the largest, but it's not the hottest.", "B"),  # ... not something else the question never asks
    ("Jupiter is the largest planet, but not the densest.", "B"),
])
def test_choice_text_a_but_clause_denies_what_the_question_asks(reply: str, letter: str | None) -> None:
    question = "Which is the largest planet in the Solar System?"
    assert CHOICE["extract_letter"](reply, PLANETS, question) == letter


@pytest.mark.parametrize(("reply", "letter"), [
    ("Answer: 2", "C"),  # a choice's text after an answer phrase, however short
    ("The answer is 2.", "C"),
    ("**Final answer:** 3", "D"),
    ("The answer is B.", "B"),  # an explicit letter is still a letter
    ("The answer is 5.", None),  # no choice's text
    ("Mars has 2 moons.", None),  # a short choice's text in prose is no answer
])
def test_choice_reads_a_choice_text_after_an_answer_phrase(reply: str, letter: str | None) -> None:
    assert CHOICE["extract_letter"](reply, ["0", "1", "2", "3"]) == letter


def test_choice_text_matches_without_a_latin_letters_accents() -> None:
    """A reply naming a choice without its accents names it (the template's own rendering: one home for the folding
    with exact_match, benchwright/drivers/templates/_reply.py)."""
    cities = ["Brasília", "São Paulo", "Salvador", "Fortaleza"]
    assert CHOICE["find_letter"]("The largest is Sao Paulo.", cities) == ("B", "choice_text")
    assert CHOICE["find_letter"]("Brasilia, the capital.", cities) == ("A", "choice_text")
    assert CHOICE["find_letter"]("かき", ["がき", "かき"]) == ("B", "choice_text")  # other scripts keep their marks


def test_choice_prompt_lists_lettered_choices_and_scores() -> None:
    row = {"question": "What is the capital of France?", "choices": CHOICES, "answer": 0}
    prompt = CHOICE["Scorer"]().extract(row)
    assert "What is the capital of France?" in prompt and "A. Paris" in prompt and "D. Madrid" in prompt
    assert CHOICE["Scorer"]().score(row, "The answer is (A).") == {"score": 1.0, "answer": "A", "reference": "A",
                                                                   "extracted": True, "rule": "letter_pattern"}
    assert CHOICE["Scorer"]().score(row, "B")["score"] == 0.0


def test_choice_with_letter_columns() -> None:
    ns = _load(ScorerPlan(template="multiple_choice",
                          fields={"input": "question", "reference": "answer", "letters": "A,B,C,D"}, why=""))
    row = {"question": "2+2?", "A": "3", "B": "4", "C": "5", "D": "22", "answer": "B"}
    assert "B. 4" in ns["Scorer"]().extract(row)
    assert ns["Scorer"]().score(row, "The answer is B.")["score"] == 1.0


@pytest.mark.parametrize(("reply", "reference", "score"), [
    ("Paris.", "paris", 1.0),
    ("The Paris", "Paris", 1.0),
    ("1,000", "1000", 1.0),
    ("London", "Paris", 0.0),
])
def test_exact_match(reply: str, reference: str, score: float) -> None:
    assert EXACT["Scorer"]().score({"question": "q", "answer": reference}, reply)["score"] == score


@pytest.mark.parametrize(("reply", "answer"), [
    ("Australia \u2192 Canberra", "Canberra"), ("Capital of Australia = Canberra", "Canberra"),
    ("**Australia** \u2013 capital: **Canberra**", "Canberra"),
    ("Canberra \u2014 the capital of Australia since 1913.", "Canberra"),  # the answer first, the restatement after
    ("Sydney is the largest city, but Canberra is the capital.", "Canberra"),
    ("Sydney is the largest city, but it is not the capital.", None),  # no answer in the last clause: none read as one
    ("Final Answer: The final answer is Canberra. I hope it is correct.", "Canberra"),
    ("Capital of Australia = the capital of Australia", None),  # both sides restate the question
])
def test_exact_match_reads_the_answer_beside_a_restatement(reply: str, answer: str | None) -> None:
    found = EXACT["find_answer"](reply, "What is the capital of Australia?")[0]
    assert (EXACT["normalize"](found) == EXACT["normalize"](answer)) if answer else found is None or (
        "canberra" not in EXACT["normalize"](found))


@pytest.mark.parametrize(("question", "reference", "reply", "score"), [
    ("In which year did the Berlin Wall fall?", "1989", "The Berlin Wall fell on November 9, 1989.", 1.0),
    ("In which year did the Berlin Wall fall?", "1989", "November 9, 1991", 0.0),  # a date of another year
    ("In which year did the Berlin Wall fall?", "1989", "It fell in 1989.", 1.0),
    ("Which date did the Berlin Wall fall?", "November 9, 1989", "1989", 0.0),  # a year is no date
    ("How many continents are there?", "7", "There are seven continents.", 1.0),
    ("How many continents are there?", "7", "There are 6 continents.", 0.0),
    ("How many continents are there?", "7", "Number of continents: 7", 1.0),
    ("Who wrote the novel 'Pride and Prejudice'?", "Jane Austen", "Jane Austen wrote it in 1813.", 1.0),
    ("Who wrote the novel 'Pride and Prejudice'?", "Jane Austen",
     "Pride and Prejudice was written by Jane Austen in 1813.", 1.0),  # "in 1813" is when, not the answer
    ("Who painted the Mona Lisa?", "Leonardo da Vinci", "It was Leonardo da Vinci who painted it.", 1.0),
    ("What is the largest ocean on Earth?", "the Pacific Ocean", "The Pacific Ocean, covering a third of Earth.", 1.0),
    ("What are the legs of a triathlon?", "swimming, cycling and running", "Swimming, cycling and running.", 1.0),
    ("What are the legs of a triathlon?", "swimming, cycling, and running", "Swimming, cycling, and running.", 1.0),
])
def test_exact_match_dates_counts_and_clefts(question: str, reference: str, reply: str, score: float) -> None:
    assert EXACT["Scorer"]().score({"question": question, "answer": reference}, reply)["score"] == score


_AUSTEN = "Who wrote the novel 'Pride and Prejudice'?"
_CAPITAL = "What is the capital of Australia?"
_PRESIDENT = "Who was the first President of the United States?"
_BOILING = "What is the boiling point of water at sea level, in degrees Celsius?"


@pytest.mark.parametrize(("reply", "score"), [
    # the answer in a later sentence, when the first gives none for sure
    ("Many people assume Sydney. However, the capital of Australia is Canberra.", 1.0),
    ("Australia is a federation of six states. Its largest cities are Sydney and Melbourne. So the capital of "
     "Australia is Canberra.", 1.0),
    ("Okay, so the question is asking about the capital of Australia. I know Sydney is the biggest city, but the "
     "capital is actually Canberra. It was chosen as a compromise between Sydney and Melbourne.", 1.0),
    ("Let me think step by step. Australia's major cities include Sydney, Melbourne and Brisbane. The capital, "
     "however, is Canberra.", 1.0),
    ("While Sydney is the largest city, Canberra is the capital of Australia.", 1.0),
    ("Sydney is the largest city and Melbourne the second largest, but neither is the capital.\n\nThe capital of "
     "Australia is Canberra.", 1.0),
    ("It's a common misconception that Sydney is the capital. In fact, it's Canberra.", 1.0),
    ("If you're thinking Sydney, think again \u2014 it's Canberra.", 1.0),
    ("The capital of Australia? That's Canberra.", 1.0),
    ("In short: Canberra.", 1.0),
    ("Canberra is Australia's capital \u2014 not Sydney, as many assume.", 1.0),
    ("1. Sydney \u2013 largest city\n2. Melbourne \u2013 second largest\n3. Canberra \u2013 the capital \u2705", 1.0),
    # ... and not a later sentence's other city, nor one it denies
    ("Canberra. The capital of Australia was Melbourne from 1901 to 1927.", 1.0),  # a bare first answer stands
    ("Many people assume Canberra. However, the capital of Australia is Sydney.", 0.0),
    ("It's a common misconception that Canberra is the capital. In fact, it's Sydney.", 0.0),
    ("While Canberra is the seat of government, Sydney is the capital of Australia.", 0.0),
    ("Canberra is a planned city. The capital of Australia, however, is Sydney.", 0.0),
    ("Many people assume Canberra. Sydney is the largest city.", 0.0),  # who assumes it does not name it
])
def test_exact_match_reads_a_later_sentence(reply: str, score: float) -> None:
    assert EXACT["Scorer"]().score({"question": _CAPITAL, "answer": "Canberra"}, reply)["score"] == score


@pytest.mark.parametrize(("question", "reference", "reply", "score"), [
    # a description before the name: the name is the answer
    (_AUSTEN, "Jane Austen", "The English novelist Jane Austen.", 1.0),
    (_CAPITAL, "Canberra", "The capital of Australia is the city of Canberra.", 1.0),
    ("Which country is home to the kangaroo?", "Australia", "The capital city of Australia.", 0.0),
    ("Which state is Albany the capital of?", "New York", "The state of New York.", 1.0),
    ("What is the largest ocean on Earth?", "the Pacific Ocean", "The vast Pacific Ocean.", 1.0),
    # ... but not a name that only ends in the reference, a denial or a relation
    ("Which English city has a famous Minster?", "York", "New York.", 0.0),
    ("Which English city has a famous Minster?", "York", "The state of New York.", 0.0),
    ("Which country?", "Korea", "South Korea", 0.0),
    (_AUSTEN, "Austen", "Jane Austen.", 0.0),
    (_CAPITAL, "Canberra", "not Canberra", 0.0),
    (_AUSTEN, "Jane Austen", "A contemporary of Jane Austen.", 0.0),
    (_AUSTEN, "Jane Austen", "The English novelist Charlotte Brontë.", 0.0),
    # surname first
    (_AUSTEN, "Jane Austen", "Austen, Jane", 1.0),
    (_AUSTEN, "Jane Austen", "Brontë, Charlotte", 0.0),
    # the name beside its description in the subject; a list stays a list
    ("Which planet is known as the Red Planet?", "Mars",
     "The fourth planet from the Sun, Mars, is called the Red Planet.", 1.0),
    (_CAPITAL, "Canberra", "The largest city, Sydney, is the capital of Australia.", 0.0),
    (_AUSTEN, "Jane Austen", "Jane Austen, the English novelist, wrote it.", 1.0),
    ("What are the legs of a triathlon?", "swimming, cycling and running",
     "Swimming, cycling and running are the legs of a triathlon.", 1.0),
    # a guess denied first, then the answer; the denial of the answer itself stays wrong
    (_CAPITAL, "Canberra", "Not Sydney! The capital is Canberra.", 1.0),
    (_CAPITAL, "Canberra", "Not Canberra. It's Sydney.", 0.0),
    (_CAPITAL, "Canberra", "Canberra? No, it's Sydney.", 0.0),
    (_AUSTEN, "Jane Austen", "Written by Charlotte Brontë, it was first published in 1847.", 0.0),
    # a role for "who": the subject said to be it
    (_AUSTEN, "Jane Austen", "Jane Austen is the author.", 1.0),
    (_AUSTEN, "Jane Austen", "Charlotte Brontë is the author.", 0.0),
    (_CAPITAL, "Canberra", "Canberra is the one.", 1.0),
    (_CAPITAL, "Canberra", "Canberra is the author.", 0.0),  # a role answers "Who...?" only
    # a count before its list, or with what it counts; two counts of it are no answer
    ("How many continents are there?", "7", "There are 6 continents: Africa, Eurasia, ...", 0.0),
    ("How many continents are there?", "7", "The Earth has six continents.", 0.0),
    ("How many continents are there?", "7", "Some say 7 continents, others 6 continents.", 0.0),
    ("How many continents are there?", "7", "7, continents", 1.0),
    # since when is not the answer; more said after "and" is not either
    (_CAPITAL, "Canberra", "Canberra has been the capital since 1913.", 1.0),
    (_CAPITAL, "Canberra", "Sydney has been the capital since 1788.", 0.0),
    (_AUSTEN, "Jane Austen", "Pride and Prejudice was written by Jane Austen and published in 1813.", 1.0),
    # a title or a kind of place before the name, words of the question beside it, where it is found
    (_PRESIDENT, "George Washington", "General George Washington.", 1.0),
    (_PRESIDENT, "George Washington", "George Washington, inaugurated in 1789.", 1.0),
    ("Which is the largest lake in Africa?", "Victoria", "Lake Victoria", 1.0),
    ("What is the longest river in Africa?", "Nile", "The Congo River.", 0.0),
    (_BOILING, "100", "100°C.", 1.0),
    (_BOILING, "100", "Water boils at 100 °C at sea level.", 1.0),
    (_BOILING, "100", "100 °F", 0.0),
    ("Is the Nile or the Amazon longer?", "Nile", "Amazon, Nile", 0.0),  # both named, as the question does
    ("Which country is home to the kangaroo?", "Australia", "Kangaroos are native to Australia.", 1.0),
    ("Which country is home to the kangaroo?", "Australia", "They're found mainly in New Guinea.", 0.0),
    (_AUSTEN, "Jane Austen", "It's Jane Austen's novel, published in 1813.", 1.0),
    (_AUSTEN, "Jane Austen", "It's Charlotte Brontë's novel.", 0.0),
    ("Whose novel is 'Emma'?", "Jane Austen's", "Jane Austen's", 1.0),  # a possessive reference is read as it is
    # a hedge after a comma: no part of the answer before a lower-case word, another guess before a name
    ("Who painted the Mona Lisa?", "Leonardo da Vinci", "Leonardo da Vinci, probably between 1503 and 1519.", 1.0),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci", "Leonardo da Vinci, most likely in Florence.", 1.0),
    (_CAPITAL, "Canberra", "Canberra, probably the least known capital.", 1.0),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci", "It was Leonardo da Vinci, possibly Michelangelo.", 0.0),
    (_CAPITAL, "Canberra", "Sydney, maybe Canberra.", 0.0),  # a false right before session 51
    (_CAPITAL, "Canberra", "Sydney, perhaps Canberra.", 0.0),
    # a short reply torn between two answers gives none (the first two read Canberra before session 51)
    (_CAPITAL, "Canberra", "Canberra? Or Sydney?", 0.0),
    (_CAPITAL, "Canberra", "Sydney, or is it Canberra?", 0.0),
    (_CAPITAL, "Canberra", "Canberra, or maybe Sydney.", 0.0),
    (_CAPITAL, "Canberra", "Canberra, I'm fairly sure.", 1.0),  # sure of one: its answer
])
def test_exact_match_names_descriptions_and_counts(question: str, reference: str, reply: str, score: float) -> None:
    assert EXACT["Scorer"]().score({"question": question, "answer": reference}, reply)["score"] == score


@pytest.mark.parametrize(("question", "reference", "reply", "score"), [
    # typography chat models write: a curly apostrophe, a citation marker, an unspaced dash, fields after a bar
    (_CAPITAL, "Canberra", "It\u2019s Canberra.", 1.0),
    (_CAPITAL, "Canberra", "It\u2019s Sydney.", 0.0),
    (_CAPITAL, "Canberra", "Canberra[1]\n\n[1] Australian Government.", 1.0),
    (_CAPITAL, "Canberra", "Canberra.[^2]", 1.0),
    (_CAPITAL, "Canberra", "Capital: Canberra | Population: ~460,000", 1.0),
    (_CAPITAL, "Canberra", "Canberra\u2014not Sydney!", 1.0),
    (_CAPITAL, "Canberra", "Sydney\u2014not Canberra!", 0.0),
    # a role as the one label of a "Who ...?" reply
    (_AUSTEN, "Jane Austen", "Author: Jane Austen", 1.0),
    (_AUSTEN, "Jane Austen", "Author: Charlotte Brontë", 0.0),
])
def test_exact_match_reads_the_typography_chat_models_write(question: str, reference: str, reply: str,
                                                             score: float) -> None:
    assert EXACT["Scorer"]().score({"question": question, "answer": reference}, reply)["score"] == score


def test_a_curly_apostrophe_reads_as_a_straight_one_in_every_template() -> None:
    assert CHOICE["extract_letter"]("A and C do not fit the question, and neither does D. I\u2019d go with B.",
                                    CHOICES) == "B"
    assert NUMERIC["find_answer"]("So James runs 540 meters a week. That\u2019s 9 sprints of 60 meters each.",
                                  "How many total meters does he run a week?")[0] == 540


_TRIVIAQA = {"aliases": ["Washington, D.C.", "Washington DC", "District of Columbia"], "normalized_aliases":
             ["washington d c", "washington dc", "district of columbia"], "normalized_value": "washington d c",
             "type": "WikipediaEntity", "value": "Washington, D.C."}


@pytest.mark.parametrize(("reference", "reply", "score"), [
    (_TRIVIAQA, "District of Columbia", 1.0),  # TriviaQA's answer object: any alias
    (_TRIVIAQA, "The capital is Washington, D.C.", 1.0),
    (_TRIVIAQA, "New York City", 0.0),
    (json.dumps(_TRIVIAQA), "Washington DC", 1.0),  # the same object as a CSV's text
    (["Roberta Flack", "Lori Lieberman"], "Lori Lieberman", 1.0),  # Natural Questions: a list of answers
    (["Roberta Flack", "Lori Lieberman"], "The Fugees", 0.0),
    ('["Roberta Flack", "Lori Lieberman"]', "Roberta Flack.", 1.0),
    ({"text": ["Denver Broncos", "Denver Broncos"], "answer_start": [177, 177]}, "The Denver Broncos", 1.0),  # SQuAD
    ("[citation needed]", "citation needed", 1.0),  # a string that is no JSON stays a string
    ([], "anything", 0.0),
    ([[[]]] * 1000, "anything", 0.0),
])
def test_exact_match_reads_every_form_of_a_reference(reference: Any, reply: str, score: float) -> None:
    row = {"question": "What is the capital of the United States?", "answer": reference}
    assert EXACT["Scorer"]().score(row, reply)["score"] == score


_ELEMENT = "Which element has atomic number 1?"
_LARGEST_OCEAN = "What is the largest ocean on Earth?"


@pytest.mark.parametrize(("question", "reference", "reply", "score"), [
    # the one name a short sentence gives besides the question's own
    ("What language is spoken in Brazil?", "Portuguese", "In Brazil, people speak Portuguese.", 1.0),
    ("What language is spoken in Brazil?", "Portuguese", "In Brazil, people speak Spanish.", 0.0),
    ("Which planet is known as the Red Planet?", "Mars", "Mars gets its nickname from its reddish colour.", 1.0),
    (_PRESIDENT, "George Washington", "George Washington took office in 1789.", 1.0),
    (_LARGEST_OCEAN, "the Pacific Ocean", "The Pacific covers about a third of Earth's surface.", 1.0),
    ("In which year did the Berlin Wall fall?", "1989", "It came down in 1989.", 1.0),  # a number asked: no name read
    # ... and none where a second name, a denial, who thinks so or what the subject is said to be tells otherwise
    (_CAPITAL, "Canberra", "Canberra is the author.", 0.0),
    (_CAPITAL, "Canberra", "Most people think Canberra.", 0.0),
    ("What is the largest city in Australia?", "Sydney", "Most people think Sydney is the capital.", 0.0),
    (_LARGEST_OCEAN, "the Pacific Ocean", "The Atlantic, second to the Pacific.", 0.0),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci", "Leonardo da Vinci's student painted it.", 0.0),
    ("What is the longest river in Africa?", "Nile", "The Amazon beats the Nile.", 0.0),
    (_PRESIDENT, "George Washington", "John Adams served under George Washington.", 0.0),
    (_AUSTEN, "Jane Austen", "Charlotte Brontë admired Jane Austen's style.", 0.0),
    # a symbol glossed in brackets, or a name with its symbol
    (_ELEMENT, "Hydrogen", "H (hydrogen)", 1.0),
    (_ELEMENT, "Hydrogen", "Hydrogen (H).", 1.0),
    (_ELEMENT, "Hydrogen", "H (helium)", 0.0),
    (_ELEMENT, "Hydrogen", "He (not hydrogen)", 0.0),
    ("Which element has the chemical symbol Au?", "Gold", "Au (gold)", 1.0),
    # the subject that has what is asked; what belongs to it
    (_ELEMENT, "Hydrogen", "Hydrogen has atomic number 1.", 1.0),
    (_ELEMENT, "Hydrogen", "Atomic number 1 belongs to hydrogen.", 1.0),
    (_ELEMENT, "Hydrogen", "Atomic number 1 belongs to helium.", 0.0),
    # a possessive, a role, the reference's own word of the question left out, asides
    (_AUSTEN, "Jane Austen", "That would be Jane Austen's work.", 1.0),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci", "It's Leonardo da Vinci's masterpiece.", 1.0),
    (_AUSTEN, "Jane Austen", "Novelist Jane Austen.", 1.0),
    (_LARGEST_OCEAN, "the Pacific Ocean", "The Pacific is the largest ocean.", 1.0),
    (_LARGEST_OCEAN, "the Pacific Ocean", "Pacific Ocean, by far.", 1.0),
    ("What is the closest star to Earth?", "the Sun", "Our Sun is the closest star.", 1.0),
    ("What is the closest star to Earth?", "the Sun", "The closest star is the Sun itself.", 1.0),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci", "Leonardo da Vinci, around 1503.", 1.0),
    # what a symbol stands for, either way round; where a name is, after it
    ("Which element has the chemical symbol Au?", "Gold", "Au stands for gold.", 1.0),
    ("What is the chemical symbol for gold?", "Au", "Au stands for gold.", 1.0),
    ("What is the chemical symbol for gold?", "Au", "Ag stands for gold.", 0.0),
    ("What is the tallest mountain in the world?", "Mount Everest", "Mount Everest in the Himalayas.", 1.0),
    ("What is the tallest mountain in the world?", "Mount Everest", "K2 in the Karakoram.", 0.0),
    ("Which English city is known for its potteries?", "Stoke on Trent", "Stoke on Trent", 1.0),  # a name's own "on"
])
def test_exact_match_reads_one_name_a_gloss_and_a_work(question: str, reference: str, reply: str,
                                                        score: float) -> None:
    assert EXACT["Scorer"]().score({"question": question, "answer": reference}, reply)["score"] == score


@pytest.mark.parametrize(("reply", "score"), [
    ("Paris", 1.0), ("Paris, France", 1.0), ("The capital of France is Paris.", 1.0), ("Lyon, France", 0.0)])
def test_exact_match_reads_a_reference_qualified_like_an_answer(reply: str, score: float) -> None:
    """A reference that restates the question after a comma loses it as an answer does, so both read "paris"."""
    row = {"question": "What is the capital of France?", "answer": "Paris, France"}
    assert EXACT["Scorer"]().score(row, reply)["score"] == score


TOOLS = _load(ScorerPlan(template="tool_call",
                         fields={"input": "question", "functions": "functions", "reference": "ground_truth"}, why=""))
WEATHER = {"name": "weather.get", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}},
               "required": ["city"]}}


def _tool_row(ground_truth: Any) -> dict[str, Any]:
    return {"question": "Weather in Paris for 3 days?", "functions": [WEATHER], "ground_truth": ground_truth}


def _reply(*calls: tuple[str, Any]) -> str:
    return json.dumps({"tool_calls": [{"name": n, "arguments": a if isinstance(a, str) else json.dumps(a)}
                                      for n, a in calls], "content": ""})


@pytest.mark.parametrize(("reply", "score"), [
    (_reply(("weather_get", {"days": 3, "city": "Paris"})), 1.0),  # order-insensitive, wire name mapped back
    (_reply(("weather_get", {"city": " Paris", "days": "3"})), 1.0),  # "3" is an integer per the schema
    (_reply(("weather_get", {"city": "Paris", "days": 3.0})), 1.0),
    (_reply(("weather_get", {"city": "Paris", "days": 4})), 0.0),
    (_reply(("weather_get", {"city": "Paris"})), 0.0),  # a missing argument
    (_reply(("weather_get", {"city": "Paris", "days": 3, "metric": True})), 0.0),  # an extra argument
    (_reply(("other", {"city": "Paris", "days": 3})), 0.0),
    (_reply(("weather_get", {"city": "Paris", "days": 3}), ("weather_get", {"city": "Paris", "days": 3})), 0.0),
    (json.dumps({"content": 'Sure:\n```json\n{"name": "weather.get", "arguments": {"city": "Paris", "days": 3}}\n```'}),
     1.0),  # a call written as JSON in the text
    (json.dumps({"content": "It is sunny."}), 0.0),
])
def test_tool_call_compares_structurally(reply: str, score: float) -> None:
    row = _tool_row({"name": "weather.get", "arguments": {"city": "Paris", "days": 3}})
    assert TOOLS["Scorer"]().score(row, reply)["score"] == score


def test_tool_call_bfcl_ground_truth_with_allowed_values_and_optional_args() -> None:
    row = _tool_row([{"weather.get": {"city": ["Paris", "Paris, France"], "days": [3], "metric": ["", True]}}])
    assert TOOLS["Scorer"]().score(row, _reply(("weather_get", {"city": "Paris, France", "days": 3})))["score"] == 1.0
    assert TOOLS["Scorer"]().score(row, _reply(("weather_get", {"city": "Paris", "days": 3,
                                                                "metric": "true"})))["score"] == 1.0
    assert TOOLS["Scorer"]().score(row, _reply(("weather_get", {"city": "Lyon", "days": 3})))["score"] == 0.0


def test_tool_call_sends_the_functions_as_tools_and_reads_tool_calls() -> None:
    row = _tool_row({"name": "weather.get", "arguments": {"city": "Paris", "days": 3}})
    seen: dict[str, Any] = {}

    class Reply(str):
        tool_calls: ClassVar[list[dict[str, Any]]] = [{
            "id": "c1", "type": "function",
            "function": {"name": "weather_get", "arguments": '{"city": "Paris", "days": 3}'}}]

    def call_sut(messages: list[dict[str, Any]], **params: Any) -> str:
        seen.update(messages=messages, **params)
        return Reply("")

    out = TOOLS["Scorer"]().solve(row, call_sut)
    assert seen["tools"][0]["function"]["name"] == "weather_get"
    assert seen["messages"][-1] == {"role": "user", "content": "Weather in Paris for 3 days?"}
    assert TOOLS["Scorer"]().score(row, out)["score"] == 1.0


CODE = _load(ScorerPlan(template="code", fields={"input": "prompt", "test": "test", "entry_point": "entry_point"},
                        why=""), code_timeout_s=2.0)
HUMANEVAL = {
    "prompt": 'def add(a: int, b: int) -> int:\n    """Return a + b."""\n',
    "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    "entry_point": "add",
}


@pytest.mark.parametrize(("reply", "code"), [
    ("Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nThis adds the numbers.",
     "def add(a, b):\n    return a + b"),
    ("```py\nimport math\n```\n\n```python\ndef add(a, b):\n    return a + b\n```",
     "def add(a, b):\n    return a + b"),
    ("Sure! def is below.\ndef add(a, b):\n    return a + b\nThat's it, hope it helps!",
     "def add(a, b):\n    return a + b"),
    ("    return a + b\n", "    return a + b"),
])
def test_code_extraction_strips_fences_and_prose(reply: str, code: str) -> None:
    assert CODE["extract_code"](reply, "add", HUMANEVAL["prompt"]) == code


@pytest.mark.parametrize(("reply", "score"), [
    ("```python\ndef add(a, b):\n    return a + b\n```", 1.0),
    ("    return a + b\n", 1.0),  # HumanEval's body-only completion
    ("```python\ndef add(a, b):\n    return a - b\n```", 0.0),
    ("```python\ndef add(a, b):\n    raise RuntimeError('boom')\n```", 0.0),
    ("I can't help with that.", 0.0),
])
def test_code_runs_the_tests(reply: str, score: float) -> None:
    assert CODE["Scorer"]().score(HUMANEVAL, reply)["score"] == score


def test_code_infinite_loop_fails_at_the_time_limit() -> None:
    started = time.monotonic()
    result = CODE["Scorer"]().score(HUMANEVAL, "```python\ndef add(a, b):\n    while True:\n        pass\n```")
    assert result["score"] == 0.0 and result["timed_out"] is True
    assert time.monotonic() - started < 6


def test_code_mbpp_style() -> None:
    ns = _load(ScorerPlan(template="code", fields={"input": "text", "test": "test_list"}, why=""))
    row = {"text": "Write a function to square a number.",
           "test_list": ["assert square(3) == 9", "assert square(0) == 0"]}
    assert "assert square(3) == 9" in ns["Scorer"]().extract(row)
    assert ns["Scorer"]().score(row, "```python\ndef square(x):\n    return x * x\n```")["score"] == 1.0
    assert ns["Scorer"]().score(row, "```python\ndef square(x):\n    return x + x\n```")["score"] == 0.0
    # a class-based solution (LeetCode's shape): the asserts' square() is its method, as for HumanEval's entry point
    solution = "```python\nclass Solution:\n    def square(self, x):\n        return x {} x\n```"
    assert ns["Scorer"]().score(row, solution.format("*"))["score"] == 1.0
    assert ns["Scorer"]().score(row, solution.format("+"))["score"] == 0.0


@pytest.mark.parametrize(("rows", "template"), [
    ([{"question": "2+2?", "answer": "4"}], "numeric"),
    ([{"question": "Natalia...", "answer": "48/2 = 24\n#### 72"}], "numeric"),
    ([{"question": "Capital of France?", "answer": "Paris"}], "exact_match"),
    ([{"question": "q", "subject": "math", "choices": ["1", "2"], "answer": 0}], "multiple_choice"),
    ([{"question": "q", "A": "1", "B": "2", "C": "3", "D": "4", "answer": "A"}], "multiple_choice"),
    ([{"id": "x", "question": "q", "function": [WEATHER], "ground_truth": []}], "tool_call"),
    ([{"task_id": "t", "prompt": "def f():", "canonical_solution": "", "test": "", "entry_point": "f"}], "code"),
    ([{"text": "t", "code": "", "test_list": []}], "code"),
])
def test_template_selection(rows: list[dict[str, Any]], template: str) -> None:
    plan = select_template(columns=list(rows[0]), rows=rows)
    assert plan.template == template and plan.why


def test_no_template_fits_names_the_columns() -> None:
    with pytest.raises(DriverFailed, match=r"\['foo', 'bar'\]"):
        select_template(columns=["foo", "bar"], rows=[{"foo": 1, "bar": 2}])


@pytest.mark.parametrize("template", sorted(TEMPLATE_FILES))
def test_rendered_templates_are_standalone_with_the_shared_rules_inlined(template: str) -> None:
    fields = {"input": "q", "reference": "a", "functions": "f", "test": "t", "entry_point": "e", "choices": "c"}
    source = render_plan(ScorerPlan(template=template, fields=fields, why=""))
    assert not re.search(r"^\s*(?:from|import)\s+benchwright", source, re.MULTILINE)  # runs with no package beside it
    assert source.count("# --- inlined from benchwright/drivers/templates/_reply.py by render() ---") == 1
    for shared in ("_names", "_reference"):  # exact_match's own shared parts
        marker = f"# --- inlined from benchwright/drivers/templates/{shared}.py by render() ---"
        assert source.count(marker) == (1 if template == "exact_match" else 0)
    assert "def answer_part(" in source
    compile(source, "task_impl.py", "exec")


@pytest.mark.parametrize(("reply", "answer"), [
    ("<think>\nIs it 41? No.\n</think>\n\n42", "42"),
    ("<THINKING>41?</THINKING>42", "42"),
    ("Let me think: 41? no.\n</think>\n42", "42"),  # the opening tag was in the prompt (DeepSeek-R1's template)
    ("<think>\nThe answer is 42, but let me check the", ""),  # cut off while reasoning: no answer
    ("\n\n    return x\n", "    return x"),  # blank lines dropped, the answer's own indentation kept
    ("The answer is 42.", "The answer is 42."),
])
def test_the_answer_part_of_a_reasoning_reply(reply: str, answer: str) -> None:
    assert NUMERIC["answer_part"](reply) == answer


@pytest.mark.parametrize(("reply", "answer"), [
    ("<reasoning>41? No.</reasoning>\n<answer>42</answer>", "42"),
    ("I will write it in <answer> tags.\n<answer>42</answer>\nCheck: 6 x 7 = 42, not 43.", "42"),
    ("<think>the <answer> is 41</think><ANSWER>\n42\n</ANSWER>", "42"),
    ("<answer> </answer> The answer is 42.", "<answer> </answer> The answer is 42."),  # an empty element is none
    ("<answer>42", "<answer>42"),  # an unclosed one is none
])
def test_an_answer_element_is_the_answer_part_of_a_short_answer(reply: str, answer: str) -> None:
    assert NUMERIC["answer_part"](reply, tags=True) == answer


def test_the_code_template_keeps_answer_markup_in_its_code() -> None:
    """A function may build such markup itself: the code template reads the whole answer part, not the element."""
    reply = "```python\ndef add(a, b):\n    return a + b  # '<answer>' + str(a + b) + '</answer>' was dropped\n```"
    assert NUMERIC["answer_part"](reply) == reply
    assert CODE["Scorer"]().score(HUMANEVAL, reply)["score"] == 1.0


def test_a_separate_reasoning_field_is_shown_in_the_output_never_scored() -> None:
    reply = SutText("#### 41", [], "I first got 42, and 42 again.")
    result = NUMERIC["Scorer"]().score({"question": "q", "answer": "41"}, reply)
    assert result["score"] == 1.0 and result["rule"] == "hashes"
    assert output_of(reply) == "<think>\nI first got 42, and 42 again.\n</think>\n\n#### 41"
    assert output_of(SutText("#### 41", [])) == "#### 41"


def test_the_output_cuts_a_long_reasoning_not_the_answer() -> None:
    answer = "The answer is 7. " * 40
    shown = output_of(SutText(answer, [], "step " * 10_000)) or ""
    assert len(shown) <= MAX_OUTPUT_CHARS and shown.endswith(answer) and "characters cut]" in shown


PRIME_CHECK = r'''
import ast, json, re, sys
from benchwright.drivers.templates import TEMPLATE_FILES, prime_source, render
source = prime_source()
exec(compile(source, "prime.py", "exec"), {"__name__": "__prime__"})  # as runner.py --prime runs it: whole
failed = []
namespace = {"__name__": "__prime__"}
for node in ast.parse(source).body:  # every statement a try: run each body bare, so a failure shows
    try:
        exec(compile(ast.Module(body=node.body, type_ignores=[]), "prime", "exec"), namespace)
    except Exception as exc:
        failed.append(f"{ast.unparse(node.body[0])[:80]}: {exc!r}")
compiled = {}
for name in sorted(TEMPLATE_FILES):
    before = set(re._cache)  # re's cache of compiled patterns (CPython 3.11: keyed by type, pattern, flags)
    exec(compile(render(name, {}), "task_impl.py", "exec"), {"__name__": "task_impl"})
    compiled[name] = sorted(str(k[1])[:60] for k in set(re._cache) - before)
print(json.dumps({"failed": failed, "compiled": compiled}))
'''


def test_the_warm_runtimes_primer_compiles_every_templates_patterns_ahead() -> None:
    """``prime_source`` (what a warm scorer runtime runs while it waits) compiles and runs as one file, each of its
    statements runs without an error of its own, and a task_impl.py rendered from any builtin template then compiles
    no regular expression of its own as it loads.
    In a fresh interpreter: this process has compiled the templates' patterns already."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", PRIME_CHECK], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["failed"] == []
    assert seen["compiled"] == {name: [] for name in sorted(TEMPLATE_FILES)}
