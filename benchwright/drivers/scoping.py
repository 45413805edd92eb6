"""Scoping phrases the builtin driver understands in a launch's ``prompt`` (§7 synthetic subsets, §13 splits).

Applied in this order, each to what the previous one left; rows keep their dataset order:

    "the <name> split", "split <name>"          rows whose ``split`` column is <name> (a split the source ships)
    "only the <value> questions"                 rows where some column equals <value> (case-insensitive; spaces
                                                 match underscores, "abstract algebra" = "abstract_algebra")
    "one sample from each <column>",             the first row of each distinct value of <column> (singular or
    "one question per <column>"                  plural: "subject" / "subjects", "category" / "categories")
    "the first N"                                the first N rows

A phrase that names a column or value the dataset does not have is an error naming what exists, never ignored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from benchwright.drivers.base import DriverFailed, SubsetChoice

_SPLIT = re.compile(r"\b(?:the\s+)?([A-Za-z][\w-]*)\s+split\b|\bsplit\s+['\"]?([A-Za-z][\w-]*)", re.IGNORECASE)
_ONLY = re.compile(r"\bonly\s+(?:the\s+)?((?:[\w'-]+\s+){0,3}?[\w'-]+)(?:\s+(?:questions?|problems?|rows?|tasks?|"
                   r"examples?|items?|samples?|ones?))?(?=$|[.,;:!?)]|\s+(?:and|from|in|of|with)\b)", re.IGNORECASE)
_EACH = re.compile(r"\bone\s+(?:[\w-]+\s+){0,3}?(?:from\s+each|per|for\s+each|of\s+each|in\s+each)\s+([A-Za-z][\w-]*)",
                   re.IGNORECASE)
_FIRST = re.compile(r"\bfirst\s+(\d{1,7})\b", re.IGNORECASE)
SPLIT_COLUMN = "split"
MAX_LISTED_VALUES = 50
"""A column with more distinct values than this (or a value longer than ``MAX_VALUE_CHARS``) is free text, not a
category: an unmatched "only the <value>" lists the values of the category columns only."""
MAX_VALUE_CHARS = 40


@dataclass
class Scope:
    """The scoping phrases found in a prompt (before they are checked against the dataset)."""

    split: str | None = None
    only: str | None = None
    each: str | None = None
    first: int | None = None
    said: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return self.split is None and self.only is None and self.each is None and self.first is None


def parse_scope(prompt: str | None) -> Scope:
    """The scoping phrases of ``prompt`` (nothing when it has none)."""
    scope = Scope()
    if not prompt:
        return scope
    if m := _SPLIT.search(prompt):
        scope.split = (m.group(1) or m.group(2)).lower()
        scope.said.append(m.group(0).strip())
    if m := _ONLY.search(prompt):
        scope.only = m.group(1).strip().lower()
        scope.said.append(m.group(0).strip())
    if m := _EACH.search(prompt):
        scope.each = m.group(1).lower()
        scope.said.append(m.group(0).strip())
    if m := _FIRST.search(prompt):
        scope.first = int(m.group(1))
        scope.said.append(m.group(0).strip())
    return scope


def _norm(value: Any) -> str:
    return " ".join(str(value).lower().replace("_", " ").split())


def _column_for(word: str, columns: list[str]) -> str | None:
    """The column a (possibly plural) word names."""
    forms = {word, word.rstrip("s"), word[:-3] + "y" if word.endswith("ies") else word, word.removesuffix("es")}
    by_lower = {c.lower(): c for c in columns}
    return next((by_lower[f] for f in forms if f in by_lower), None)


def select_rows(scope: Scope, *, columns: list[str], rows: Iterable[dict[str, Any]]) -> SubsetChoice | None:
    """The subset ``scope`` asks for, streaming ``rows`` once (memory holds the indices, not the rows).

    Raises:
        DriverFailed: a phrase names a split, column or value the dataset does not have (listing what it has).
    """
    if scope.empty:
        return None
    split_col = _column_for(SPLIT_COLUMN, columns) if scope.split else None
    if scope.split and split_col is None:
        raise DriverFailed(f"the prompt asks for the '{scope.split}' split, but the dataset has no split column "
                           f"(columns: {columns})", code="scope_unmatched")
    each_col = _column_for(scope.each, columns) if scope.each else None
    if scope.each and each_col is None:
        raise DriverFailed(f"the prompt asks for one row from each '{scope.each}', but no column is called that "
                           f"(columns: {columns})", code="scope_unmatched")
    only = _norm(scope.only) if scope.only else None
    picked: list[int] = []
    seen_values: set[str] = set()
    split_values: set[str] = set()
    only_columns: set[str] = set()
    categories: dict[str, set[str] | None] = {}  # column -> its distinct values (None: free text)
    scanned = 0
    for index, row in enumerate(rows):
        if only is not None:
            scanned += 1
            _tally(categories, row)
        if split_col is not None:
            split_values.add(str(row.get(split_col)))
            if _norm(row.get(split_col, "")) != scope.split:
                continue
        if only is not None:
            hits = [c for c, v in row.items() if isinstance(v, (str, int)) and _norm(v) == only]
            if not hits:
                continue
            only_columns.update(hits)
        if each_col is not None:
            value = _norm(row.get(each_col, ""))
            if value in seen_values:
                continue
            seen_values.add(value)
        picked.append(index)
        if scope.first is not None and len(picked) >= scope.first and each_col is None:
            break
    if scope.first is not None:
        picked = picked[:scope.first]
    if not picked:
        where = f" (its splits: {sorted(split_values)})" if split_col is not None else ""
        if only is not None and not only_columns:
            where += _values_listed(scope.only or "", categories, scanned)
        raise DriverFailed(f"no row matches the prompt's scope ({'; '.join(scope.said)}){where}",
                           code="scope_unmatched")
    return SubsetChoice(name=_name(scope), indices=picked, recipe=_recipe(scope, each_col, only_columns),
                        synthetic=not (scope.split and scope.only is None and scope.each is None
                                       and scope.first is None))


def _tally(categories: dict[str, set[str] | None], row: dict[str, Any]) -> None:
    """Add ``row``'s short string/int values to each column's distinct values (bounded per column)."""
    for column, value in row.items():
        if categories.get(column, set()) is None:
            continue
        if not isinstance(value, (str, int)) or isinstance(value, bool) or len(str(value)) > MAX_VALUE_CHARS:
            categories[column] = None
            continue
        seen = categories.setdefault(column, set())
        assert seen is not None
        seen.add(str(value))
        if len(seen) > MAX_LISTED_VALUES:
            categories[column] = None


def _values_listed(asked: str, categories: dict[str, set[str] | None], rows: int) -> str:
    """``; no column has the value 'x'; the values that exist: col: a, b, ...`` over the category columns (those
    whose values repeat: a column of all-distinct values is an id or the question itself; numbers are answer keys,
    not categories a prompt names)."""
    listed = [f"{column}: {', '.join(sorted(values))}" for column, values in sorted(categories.items())
              if values and len(values) < rows and not all(v.lstrip("-").isdigit() for v in values)]
    if not listed:
        return f"; no column has the value '{asked}', and no column holds a few repeated values to choose from"
    return f"; no column has the value '{asked}'; the values that exist: {'; '.join(listed)}"


def _name(scope: Scope) -> str:
    parts = []
    if scope.split:
        parts.append(scope.split)
    if scope.only:
        parts.append(re.sub(r"\W+", "-", scope.only))
    if scope.each:
        parts.append(f"one-per-{scope.each}")
    if scope.first is not None:
        parts.append(f"first-{scope.first}")
    return "-".join(parts)


def _recipe(scope: Scope, each_col: str | None, only_columns: set[str]) -> str:
    steps = []
    if scope.split:
        steps.append(f"rows of the '{scope.split}' split")
    if scope.only:
        steps.append(f"rows whose {'/'.join(sorted(only_columns))} is '{scope.only}'")
    if each_col:
        steps.append(f"the first row for each value of '{each_col}'")
    if scope.first is not None:
        steps.append(f"the first {scope.first}")
    return "; then ".join(steps)
