"""Shared by the exact-match template (``exact.py``): counts and dates as replies write them, compared as a reference
writes them ("Seven" for 7, "7 continents" for "How many continents ...?", "November 9, 1989" for the year 1989).

Standard library only; inlined by :func:`benchwright.drivers.templates.render` like ``_reply.py`` (from its first
``import`` on), so the rendered task_impl.py stays one standalone file.
"""

import re

# "How many ...?", "How much ...?": a count asked for, and the words that name one in a question.
_HOW_MANY = re.compile(r"(?i)\bhow (?:many|much)\b")
_COUNT_WORDS = frozenset(("number", "count", "total", "amount"))
# A count spelled out, compared as its digits: "Seven" is "7".
_NUMBER_WORDS = {w: str(i) for i, w in enumerate((
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty"))}
_NUMBER_WORD = re.compile(r"\b(?:" + "|".join(_NUMBER_WORDS) + r")\b")
# A count and the thing counted that the question names: "7 continents" for "How many continents are there?"
_COUNTED = re.compile(r"^(\d[\d,.]*|(?i:" + "|".join(_NUMBER_WORDS) + r"))\s+(.+)$")
_COUNT_NOUN = re.compile(r"\b(\d+(?:,\d{3})*|" + "|".join(_NUMBER_WORDS) + r")\s+([a-z][\w-]*)", re.IGNORECASE)
# A count before the list of what it counts: "There are 7 continents: Africa, ...", "Seven: Africa, ..."
_COUNT_FIRST = re.compile(r"\A\W*(?:there\s+(?:are|were)\s+)?(?:\*\*)?(\d+(?:,\d{3})*|" + "|".join(_NUMBER_WORDS)
                          + r")(?:\*\*)?(?:\s+([a-z][\w\s-]{0,40}?))?\s*(?:\*\*)?:", re.IGNORECASE)
# A date whose year a question asks for: "November 9, 1989", "9 November 1989", "in 1989" (normalised)
_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
_DATE_OF_YEAR = re.compile(r"(?:(?:in|on)\s+)?(?:(?:\d{1,2}(?:st|nd|rd|th)?\s+)?(?:" + _MONTHS + r")\s+"
                           r"(?:\d{1,2}(?:st|nd|rd|th)?\s+)?)?(\d{4})")
