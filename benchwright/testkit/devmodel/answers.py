"""The dev model's answer table: loading it, which questions are answered correctly (hash-chosen, deterministic)
and the plausible wrong answer given otherwise."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from decimal import Decimal, InvalidOperation
from pathlib import Path

# Decoys for wrong answers to free-text questions: plausible quiz-style answers, so a wrong reply
# looks like a confident mistake rather than an obvious sentinel.
_DECOYS = (
    "Paris",
    "Mercury",
    "William Shakespeare",
    "Photosynthesis",
    "Oxygen",
    "Jupiter",
    "Albert Einstein",
    "The Amazon River",
    "Mount Everest",
    "Carbon dioxide",
    "Leonardo da Vinci",
    "The Pacific Ocean",
)
_YES_NO_FLIPS = {"yes": "no", "no": "yes", "true": "false", "false": "true"}

# --------------------------------------------------------------------------------------------------
# Answer table
# --------------------------------------------------------------------------------------------------


def load_answers(path: str | Path) -> dict[str, str]:
    """Load a ``question -> answer`` table from a JSONL file.

    Each non-blank line must be a JSON object with a non-empty string ``"question"`` and an
    ``"answer"`` that is a string or a number (numbers are converted with ``str``, so GSM8K-style
    numeric answers load as-is). Questions are stripped of surrounding whitespace. When a question
    occurs more than once the first occurrence wins, since real datasets do contain duplicates.

    Args:
        path: Path of the JSONL file (UTF-8, a leading BOM is tolerated).

    Returns:
        The table, in file order.

    Raises:
        ValueError: A line is not valid JSON or lacks a usable question/answer; the message names
            the file and the 1-based line number.
        OSError: The file cannot be read.
    """
    path = Path(path)
    answers: dict[str, str] = {}
    with path.open(encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}: line {lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: invalid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
            question = record.get("question")
            if not isinstance(question, str) or not question.strip():
                raise ValueError(f'{where}: "question" must be a non-empty string')
            answer = record.get("answer")
            # bool is an int subclass, but "True" as an answer is almost certainly a data mistake.
            if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
                raise ValueError(f'{where}: "answer" must be a string or a number')
            answers.setdefault(question.strip(), str(answer))
    return answers


# --------------------------------------------------------------------------------------------------
# Deterministic verdicts and wrong answers
# --------------------------------------------------------------------------------------------------


def is_answered_correctly(question: str, accuracy: float, seed: str = "") -> bool:
    """Decide, deterministically, whether the double answers ``question`` correctly.

    The first 8 bytes of ``sha256(question)`` are read as a number u uniform in [0, 1); the question
    is answered correctly iff ``u < accuracy``. The same question therefore always gets the same
    verdict (across calls, processes and machines), and over many questions the fraction answered
    correctly is ≈ ``accuracy``. Raising the accuracy only ever turns wrong verdicts into right ones.

    Args:
        question: The question text (as stored in the answer table).
        accuracy: Target fraction of correct answers, in [0, 1].
        seed: Prefixed to the question before hashing (``DevModelConfig.seed``).

    Returns:
        True when the correct answer should be given.

    Raises:
        ValueError: ``accuracy`` is outside [0, 1].
    """
    if not 0.0 <= accuracy <= 1.0:
        raise ValueError(f"accuracy must be in [0, 1], got {accuracy!r}")
    digest = hashlib.sha256((seed + question).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < accuracy


def rows_answered_correctly(path: str | Path, accuracy: float, seed: str = "") -> tuple[int, int]:
    """How many rows of a JSONL dataset a dev model with this ``accuracy`` answers correctly, and how many rows
    there are: :func:`is_answered_correctly` applied to each row's question (the hash decides per question, so on
    a small set the count differs from ``accuracy`` x rows; the demo prints it beside the score)."""
    right = total = 0
    with Path(path).open(encoding="utf-8-sig") as fh:
        for line in fh:
            if line.strip():
                total += 1
                right += is_answered_correctly(str(json.loads(line)["question"]).strip(), accuracy, seed)
    return right, total


def wrong_answer(answer: str) -> str:
    """Return a deterministic, plausible wrong answer for ``answer``.

    * integers (``"41"``, ``"-3"``, ``"1,000"``) -> the integer + 1, same style;
    * decimals (``"2.5"``) -> the number + 1;
    * yes/no and true/false -> the opposite;
    * a single letter (a multiple-choice option) -> the next option letter;
    * anything else -> a hash-chosen quiz-style decoy.

    The result never equals ``answer`` after normalising case, whitespace and punctuation, and for
    free text it also neither contains nor is contained in it, so lenient "contains" graders cannot
    score it as correct by accident.

    Args:
        answer: The correct answer.

    Returns:
        A wrong answer.
    """
    target = _normalize(answer)
    for candidate in _wrong_candidates(answer.strip()):
        if _clearly_differs(_normalize(candidate), target):
            return candidate
    # Unreachable in practice (the decoy stream is unbounded), kept so the contract is explicit.
    raise AssertionError(f"no wrong answer found for {answer!r}")  # pragma: no cover


def _normalize(text: str) -> str:
    """Lower-case, drop punctuation, collapse whitespace: the comparison the contract promises."""
    kept = "".join(ch if ch.isalnum() or ch.isspace() else "" for ch in text.lower())
    return " ".join(kept.split())


def _clearly_differs(candidate: str, target: str) -> bool:
    """True when ``candidate`` cannot be mistaken for ``target`` by exact or contains matching."""
    if not candidate or candidate == target:
        return False
    if not target:
        return True
    return target not in candidate and candidate not in target


def _wrong_candidates(answer: str) -> Iterable[str]:
    """Yield wrong-answer candidates for ``answer``, most plausible first (may be unbounded)."""
    # +1 is the plausible off-by-one; +2 covers the rare sign flip that normalises equal (-0.5 -> 0.5).
    for delta in (1, 2):
        numeric = _shift_number(answer, delta)
        if numeric is not None:
            yield numeric
    flipped = _YES_NO_FLIPS.get(answer.lower().rstrip("."))
    if flipped is not None:
        yield _match_case(flipped, answer)
    if len(answer) == 1 and answer.isascii() and answer.isalpha():
        yield _next_option_letter(answer)
    seed = int.from_bytes(hashlib.sha256(answer.encode("utf-8")).digest()[:8], "big")
    for i in range(len(_DECOYS)):
        yield _DECOYS[(seed + i) % len(_DECOYS)]
    # Every decoy collided (the answer mentions them all): fall back to numbered decoys, which
    # eventually are longer than, and so cannot be contained in, any finite answer.
    n = 2
    while True:
        yield f"{_DECOYS[seed % len(_DECOYS)]} {n}"
        n += 1


def _shift_number(answer: str, delta: int) -> str | None:
    """Return the number in ``answer`` plus ``delta`` in the same style, or None if not a number."""
    grouped = "," in answer
    digits = answer.replace(",", "") if grouped else answer
    try:
        if digits.lstrip("+-").isdigit():
            shifted: int | Decimal = int(digits) + delta
        else:
            value = Decimal(digits)
            if not value.is_finite():
                return None
            shifted = value + delta
    except (ValueError, InvalidOperation):
        return None
    return f"{shifted:,}" if grouped else str(shifted)


def _next_option_letter(letter: str) -> str:
    """Next multiple-choice letter: cycles A-D (the usual option set), else the next in A-Z."""
    base = "A" if letter.isupper() else "a"
    index = ord(letter) - ord(base)
    span = 4 if index < 4 else 26
    return chr(ord(base) + (index + 1) % span)


def _match_case(word: str, like: str) -> str:
    """Give ``word`` the capitalisation style of ``like`` (YES / Yes / yes)."""
    if like.isupper() and len(like) > 1:
        return word.upper()
    if like[:1].isupper():
        return word.capitalize()
    return word
