"""Shared by the numeric template (``numeric.py``): quantities written otherwise than as one number in digits, spelled
as one before the number rules read the reply: a fraction written as one character ("3\u00bd" -> "7/2") and a quantity
in two units ("2 hours and 30 minutes" -> "150 minutes").

Standard library only; inlined by :func:`benchwright.drivers.templates.render` like ``_reply.py`` (from its first
``import`` on), so the rendered task_impl.py stays one standalone file.
"""

import re
from fractions import Fraction

# A fraction written as one character: "3\u00bd cups", "\u00be of the pie" (after a whole number, or alone).
_VULGAR = "\u00bd\u2153\u2154\u00bc\u00be\u2155\u2156\u2157\u2158\u2159\u215a\u215b\u215c\u215d\u215e"
_VULGAR_VALUES = dict(zip(_VULGAR, ((1, 2), (1, 3), (2, 3), (1, 4), (3, 4), (1, 5), (2, 5), (3, 5), (4, 5), (1, 6),
                                    (5, 6), (1, 8), (3, 8), (5, 8), (7, 8)), strict=True))
_VULGAR_RUN = re.compile(r"(?<![\d,.])(?:(\d{1,3}(?:,\d{3}){1,4}|\d{1,15})[ \u2009]?)?([" + _VULGAR + "])")
# A quantity written in two units: "2 hours and 30 minutes", "1 h 15 min", "5 feet, 6 inches", "3 min 20 s".
# (up to 15 digits a part: a longer run of digits is no such quantity, and int() refuses one past 4,300)
_COMPOUND = re.compile(r"(?<![\w.,/])(\d{1,15})\s?([a-zA-Z]+)\.?,?\s*(?:and\s+)?(\d{1,15}(?:\.\d{1,15})?)\s?"
                       r"([a-zA-Z]+)\b")
_UNIT_NAMES = {name: unit for unit, names in (
    ("h", "hour hours hr hrs h"), ("min", "minute minutes min mins"), ("s", "second seconds sec secs s"),
    ("d", "day days"), ("wk", "week weeks"), ("yr", "year years"), ("mo", "month months"), ("ft", "foot feet ft"),
    ("in", "inch inches in"), ("lb", "pound pounds lb lbs"), ("oz", "ounce ounces oz"), ("usd", "dollar dollars"),
    ("c", "cent cents"), ("km", "kilometer kilometers kilometre kilometres km"),
    ("m", "meter meters metre metres m"), ("cm", "centimeter centimeters centimetre centimetres cm"),
    ("kg", "kilogram kilograms kg"), ("g", "gram grams g")) for name in names.split()}
_IN_SMALLER = {("h", "min"): 60, ("h", "m"): 60, ("min", "s"): 60, ("d", "h"): 24, ("wk", "d"): 7, ("yr", "mo"): 12,
               ("ft", "in"): 12, ("lb", "oz"): 16, ("usd", "c"): 100, ("km", "m"): 1000, ("m", "cm"): 100,
               ("kg", "g"): 1000}


def spelled_fractions(text):
    """``text`` with each fraction written as one character spelled as a/b: "3\u00bd" -> "7/2", "\u00be" -> "3/4"
    (read by the number rules like any fraction; a text without one is returned as it is, at the cost of one scan)."""
    if _VULGAR_RUN.search(text) is None:
        return text

    def spelled(m):
        value = Fraction(*_VULGAR_VALUES[m.group(2)]) + (int(m.group(1).replace(",", "")) if m.group(1) else 0)
        return f"{value.numerator}/{value.denominator}"

    return _VULGAR_RUN.sub(spelled, text)


def spelled_compounds(text):
    """``text`` with each quantity written in two units spelled as one number of the smaller ("2 hours and 30 minutes"
    -> "150 minutes", "5 ft 6 in" -> "66 in"), and each such number's reading in the larger unit ({150: 5/2}). Only
    units one counts in the other, with the smaller part less than one of the larger ("3 days and 30 hours" stays)."""
    readings = {}

    def spelled(m):
        ratio = _IN_SMALLER.get((_UNIT_NAMES.get(m.group(2).lower(), ""), _UNIT_NAMES.get(m.group(4).lower(), "")))
        small = Fraction(m.group(3))
        if ratio is None or small >= ratio:
            return m.group(0)
        value = int(m.group(1)) * ratio + small
        readings[value] = value / ratio
        return f"{value} {m.group(4)}"  # "150 minutes"; "181/2 seconds" for "1 minute 30.5 seconds"

    return _COMPOUND.sub(spelled, text), readings
