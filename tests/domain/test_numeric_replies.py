"""The numeric template reads the final answer of worked replies as today's chat and reasoning models write them: what
follows the answer and says no number of its own (an explanation in parentheses, a check, the question's givens
restated, a breakdown that works out to it) is not read as the answer, a reply cut off mid-working gives none, and a
result spelled out in words after digits is read; and replies that say a new number after such talk keep it."""

from __future__ import annotations

import time
from fractions import Fraction
from typing import Any

import pytest

from benchwright.drivers import ScorerPlan
from benchwright.drivers.templates import render_plan


def _load(plan: ScorerPlan) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": "task_impl"}
    exec(compile(render_plan(plan), "task_impl.py", "exec"), ns)  # the file under test, as Atomize writes it
    return ns


NUMERIC = _load(ScorerPlan(template="numeric", fields={"input": "question", "reference": "answer"}, why=""))

JANET = ("Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning and bakes muffins for her "
         "friends every day with four. She sells the remainder at the farmers' market daily for $2 per fresh duck egg. "
         "How much in dollars does she make every day at the farmers' market?")
JAMES = ("James decides to run 3 sprints 3 times a week. He runs 60 meters each sprint. How many total meters does he "
         "run a week?")
MARBLES = "Tom has 5 red and 7 blue marbles. He gives away 7. How many are left?"


def _read(reply: str, question: str = JANET) -> Fraction | None:
    return NUMERIC["find_answer"](reply, question)[0]  # type: ignore[no-any-return]


@pytest.mark.parametrize(("reply", "value"), [
    # an explanation in parentheses after the answer, with two numbers or more
    ("So she makes $18 per day. (That's 16 - 3 - 4 = 9 eggs sold at $2 each.)", "18"),
    ("The reduction is 25% ($20 off the original $80).", "25"),
    ("It was -7°C at midnight (12 degrees below the noon reading of 5°C).", "-7"),
    # a check after it whose numbers are said before it or given by the question
    ("She sells 9 eggs a day, so she makes 9 × $2 = $18 per day.\n\nCheck: 9 × 2 = 18 ✓ and 3 + 4 + 9 = 16 ✓", "18"),
    ("She makes $18 a day.\n\nLet me verify: 16 - 3 - 4 leaves 9, and 9 at $2 is 18 ✓ (not 16)", "18"),
    # a breakdown after it: its numbers said before, or working out to it
    ("She sold 48 clips in April and 24 in May, for a total of 72 clips. That is 48 in April plus 24 in May.", "72"),
    ("So James runs a total of 540 meters a week. That's 9 sprints of 60 meters each.", "540"),
    ("She made $18: 9 eggs at $2 each.", "18"),
    # the question's givens restated after it
    ("Janet makes $18 every day. Her ducks lay 16 eggs, she eats 3 and bakes with 4, and she sells each for $2.", "18"),
    ("He runs 540 meters per week.\n\nStep-by-step:\n1. Sprints per session: 3\n2. Sessions per week: 3\n"
     "3. Meters per sprint: 60", "540"),
    # the result spelled out after digits, counting what the question asks about
    ("She sells 9 eggs. She makes eighteen dollars a day.", "18"),
])
def test_numeric_reads_the_answer_before_what_follows_it(reply: str, value: str) -> None:
    question = JAMES if "James" in reply or "meters" in reply else JANET
    assert _read(reply, question) == Fraction(value)


@pytest.mark.parametrize(("reply", "value"), [
    # a check or a breakdown that says a new number: it is read
    ("She makes $16 a day.\n\nCheck: 9 × 2 = 18, not 16. So she makes $18.", "18"),
    ("I first got $16.\n\nCheck: 16 - 3 - 4 = 9 eggs, 9 × 2 = 18", "18"),
    ("She makes 9 × $2 = $16 a day.\n\nCheck: 9 × 2 = 18 ✓", "18"),
    ("She sells 16 - 3 - 4 = 9 eggs at $2 each. That's $18.", "18"),
    ("She sells 16 - 3 - 4 = 9 eggs at $2 each. That's 9 × 2 = 18 dollars a day.", "18"),
    ("Revenue: 16.\n\nThat's 9 eggs at $2 each.", "2"),  # a breakdown that does not come to it: read as before
    # a parenthetical that says a result: its working's result, one number, or a conclusion
    ("She sells 9 eggs a day (9 × $2 = $18 per day).", "18"),
    ("She sells 9 eggs at $2 each (so $18 a day).", "18"),
    ("It takes 2 bolts of blue and 1 of white (3 bolts in total).", "3"),
    ("So she makes $16 per day. (I first thought 18 but 9 × 2 is 16.)", "16"),
    # a recap that lists the answer last, and explanation openers before the answer
    ("She sells 9 eggs and keeps 7.\n\nSummary: 16 laid, 7 used, 9 sold, $18 earned.", "18"),
    ("Janet has 16 eggs.\n\nStep-by-step:\n1. 16 - 3 - 4 = 9\n2. 9 × 2 = 18", "18"),
    ("Here's how: 16 - 3 - 4 = 9 eggs, 9 × $2 = $18.", "18"),
    # spelled-out counts of something the question does not ask about
    ("She makes $18 a day. There are two ways to check this.", "18"),
    ("So she makes $18. I did it in two steps.", "18"),
])
def test_numeric_keeps_a_number_said_after_the_answer_when_it_is_new(reply: str, value: str) -> None:
    assert _read(reply) == Fraction(value)


def test_numeric_keeps_a_conclusion_that_says_the_questions_numbers() -> None:
    """The answer may be one of the question's numbers: a conclusion that says it is no restatement of the givens."""
    assert _read("5 + 7 = 12, and 12 - 7 = 5. So Tom has 5 marbles left.", MARBLES) == 5
    assert _read("He has 12 marbles and gives away 7... so 5 red and 7 blue become 5.", MARBLES) == 5
    assert _read("5 + 7 = 12 and 12 - 7 = 5. Finally, he counted 7.", MARBLES) == 7  # one given said last: read
    # ... unless its sentence says the question's own again, nearly word for word
    assert _read("5 + 7 = 12 and 12 - 7 = 5. He gave away 7.", MARBLES) == 5
    assert _read("Janet sells 9 eggs at $2, which is $18. Her ducks lay 16 eggs per day.") == 18


SHIRT = "A shirt costs $25. It is on sale for 20% off. What is the sale price in dollars?"
ROBE = "A robe takes 2 bolts of blue fiber and half that much white fiber. How many bolts in total does it take?"
WENG = ("Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she "
        "earn?")


@pytest.mark.parametrize(("reply", "question", "value"), [
    # a given bolded as the question is said again: the result after it is read
    ("Janet's ducks lay **16 eggs** a day. She eats 3 and bakes with 4, which leaves 9 eggs. At $2 each, she makes $18 "
     "every day.", JANET, "18"),
    # ... but a bolded given that is the result, in a sentence of the reply's own, is read
    ("Tom ends up with **7** marbles: 5 red and 7 blue make 12, and he gives 5 of them away.", MARBLES, "7"),
    # the result sentence ending on a given said with the question's own word after it ("50 minutes")
    ("Weng earned $10 for 50 minutes of babysitting ($12/hour × 50/60 hour).", WENG, "10"),
    ("She earned $10 in 50 minutes.", WENG, "10"),
    # ... not past a given said otherwise, nor to a number the question gives
    ("She babysat for 50 minutes and earned 12.", WENG, "12"),
    ("After 50 minutes she had earned $12 for 50 minutes.", WENG, "50"),
    # a step's result ("leaves 9", "= 9") the working after a dash goes on from
    ("$18 daily — 16 eggs minus 3 minus 4 leaves 9, at $2 apiece.", JANET, "18"),
    ("$20 daily — 16 eggs minus 3 minus 4 leaves 9, at $2 apiece.", JANET, "2"),  # it does not come to 20: no total
    # a bold result with its unit (and full stop) inside the bold
    ("📌 April: 48 clips\n📌 May: half of 48 = 24 clips\n\n➡️ Total = 48 + 24 = **72 clips**", JANET, "72"),
    ("**72 clips.**\n\nIn April she sold **48**, and in May half as many, **24**.", JANET, "72"),
    ("**72 clips.**\r\n\r\nIn April she sold **48**, and in May **24**.", JANET, "72"),  # CRLF line ends
    ("**1.** She eats 3.\n**2.** She bakes with 4.\n\nSo she sells 9 eggs for $18.", JANET, "18"),  # a list, no 1
    # a total said first "in total:", its parts after the colon; "In total: 3" alone is still an answer phrase
    ("It takes 3 bolts in total: 2 bolts of blue fiber and 1 of white.", ROBE, "3"),
    ("Blue: 2 bolts. White: 1 bolt.\n\nIn total: 3 bolts.", ROBE, "3"),
    # a closing clause that compares the result with a given
    ("It costs $20 on sale, $5 less than its $25 price.", SHIRT, "20"),
    ("The sale price is $20, which is 80% of the original $25.", SHIRT, "20"),
    ("$20 — that's $5 off the $25 price.", SHIRT, "20"),
    ("She makes $18 a day, $14 less than if she sold all 16 eggs.", JANET, "18"),
    # ... not a clause that says the result itself
    ("She sells 9 eggs, which is $18.", JANET, "18"),
    ("The discount is $5 on the $25 shirt, so it costs $20, $5 less than its price.", SHIRT, "20"),
    # a closing note with a number of its own
    ("**Janet makes $18 per day.**\n\n_Note: this assumes she sells all 9 remaining eggs._", JANET, "18"),
    ("She sells 9 eggs.\n\n**Assumption:** every one of the 9 is sold at $2, so $18.", JANET, "18"),  # it concludes
])
def test_numeric_reads_the_result_past_a_restated_given_or_a_note(reply: str, question: str, value: str) -> None:
    assert _read(reply, question) == Fraction(value)


@pytest.mark.parametrize("reply", [
    "Let's solve this step by step.\n\n1. Eggs laid: 16\n2. Eaten for breakfast: 3\n3. Used for muffins: 4\n"
    "4. Remaining eggs: 16 - 3 - 4 = 9\n5. Price per egg: $2\n\nNow we multiply the",
    "Let me solve this step by step.\n\n**Step 1:** April sales = 48 clips\n\n**Step 2:** May sales = 48 ÷ 2 = 24 "
    "clips\n\n**Step 3:** Total = 48 +",
    "First, compute the total investment: $80,000 + $50,000 = $130,000. Next, the value increased by 150%, so",
    "She sells 16 - 3 - 4 = 9 eggs, and 9 ×",
])
def test_numeric_reads_no_answer_from_a_reply_cut_off_mid_working(reply: str) -> None:
    result = NUMERIC["Scorer"]().score({"question": JANET, "answer": "#### 9"}, reply)
    assert (result["extracted"], result["answer"], result["rule"], result["score"]) == (False, None, None, 0.0)


@pytest.mark.parametrize(("reply", "value"), [
    ("She makes $18 a day", "18"), ("9 × 2 = 18", "18"), ("So she makes **$18**", "18"),
    ("#### 18\n\nLet me double-check: 16 - 3 - 4 = 9 and 9 times 2 is", "18"),
    ("Janet makes **$18** a day.\n\nHere's the working: 16 - 3 - 4 = 9 eggs, and 9 × 2 =", "18"),
    ("The answer is 18.\n\nTotal = 9 +", "18"),  # an earlier answer phrase stands
])
def test_numeric_reads_a_finished_answer_without_a_full_stop_or_before_the_cut(reply: str, value: str) -> None:
    assert _read(reply) == Fraction(value)


def test_numeric_needs_the_question_to_read_a_spelled_result_after_digits() -> None:
    assert NUMERIC["extract_answer"]("She sells 9 eggs. She makes eighteen dollars a day.") == 9
    assert _read("She sells 9 eggs. She makes eighteen dollars or sixteen dollars.") == 9  # two counts: neither is read


@pytest.mark.parametrize("reply", [
    "1234 5 " * 28_000, "= 1 " * 50_000, "(" * 100_000 + "1" + ")" * 100_000, "(1 2 " * 40_000, "so " * 66_000 + "1 2",
    "Check: 1 2. " * 16_000, "That's 16 3. " * 15_000, "16 3 4. " * 25_000, "eighteen dollars " * 12_000,
    "Total = 1 + " * 16_000, "16 - " * 40_000,
])
def test_numeric_scores_a_hostile_200k_reply_quickly(reply: str) -> None:
    started = time.perf_counter()
    result = NUMERIC["Scorer"]().score({"question": JANET, "answer": "#### 18"}, reply)
    assert result["score"] in (0.0, 1.0)
    # Not a speed target (those live in bench/): a hang guard. These take ~0.3 s; the quadratic path this session
    # caught took 51 s on one of them, so 10 s tells a hang from a loaded machine.
    assert time.perf_counter() - started < 10.0
