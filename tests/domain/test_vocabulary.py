"""The control vocabulary has one home (issue 24): halt reasons live in ``benchwright.runs.halts``, event type names in
``benchwright.events``. The reasons round-trip through their §9 wire strings, and a static read of the code keeps
their string literals from coming back anywhere else."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import benchwright.events as events
from benchwright.runs.halts import RESUMABLE, HaltKind, HaltReason, halt_kind, is_resumable
from benchwright.runs.status import display_status

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("benchwright", "api", "activities", "workflows")
HOMES = {"benchwright/events.py", "benchwright/runs/halts.py"}
EVENT_TYPES = {name for name, obj in vars(events).items()
               if isinstance(obj, type) and issubclass(obj, events.Event) and obj is not events.Event}
HALT_LITERAL = re.compile(r"^(?:(?:" + "|".join(k.value for k in HaltKind if k is not HaltKind.ADMIN)
                          + r")(?::.*)?|admin:.*)$", re.S)
NOT_HALTS = {
    ("benchwright/errors.py", "balance_exhausted"),  # PaymentRequired's error code, not a halt reason
    ("benchwright/scoring/host.py", "limit_exceeded"),  # the task row's meta key naming the crossed limit
}
"""Literals that spell a halt kind but mean something else (file, literal)."""


@pytest.mark.parametrize("wire, kind, detail", [
    ("operator_pause", HaltKind.OPERATOR_PAUSE, None),
    ("operator_kill", HaltKind.OPERATOR_KILL, None),
    ("operator_kill: too slow", HaltKind.OPERATOR_KILL, "too slow"),
    ("admin: abuse report 12", HaltKind.ADMIN, "abuse report 12"),
    ("agent_review: which column is the answer?", HaltKind.AGENT_REVIEW, "which column is the answer?"),
    ("restart_cap_exceeded: the impl keeps failing", HaltKind.RESTART_CAP_EXCEEDED, "the impl keeps failing"),
    ("limit_exceeded:run.cost", HaltKind.LIMIT_EXCEEDED, "run.cost"),
    ("limit_exceeded:phase:atomize.duration", HaltKind.LIMIT_EXCEEDED, "phase:atomize.duration"),
    ("balance_exhausted", HaltKind.BALANCE_EXHAUSTED, None),
    ("sut_unavailable: the endpoint refused the key (5 model calls in a row failed)", HaltKind.SUT_UNAVAILABLE,
     "the endpoint refused the key (5 model calls in a row failed)"),
])
def test_halt_reasons_round_trip_their_wire_strings(wire: str, kind: HaltKind, detail: str | None) -> None:
    parsed = HaltReason.parse(wire)
    assert parsed == HaltReason(kind, detail)
    assert parsed.wire() == wire == str(parsed)


def test_resumable_and_display_follow_the_kind() -> None:
    assert {k.value for k in RESUMABLE} == {"agent_review", "operator_pause", "restart_cap_exceeded"}  # §9
    assert is_resumable("agent_review: x") and is_resumable("operator_pause")
    assert not is_resumable("operator_kill: x") and not is_resumable(None) and not is_resumable("something else")
    assert halt_kind("made up") is None and HaltReason.parse("") is None
    shown = {reason: display_status(status="running", halted=True, halt_reason=reason) for reason in (
        "operator_pause", "agent_review: a", "restart_cap_exceeded: b", "operator_kill", "admin: c",
        "limit_exceeded:run.cost", "balance_exhausted", "sut_unavailable: d", "unknown", None)}
    assert shown == {"operator_pause": "paused", "agent_review: a": "waiting", "restart_cap_exceeded: b": "waiting",
                     "operator_kill": "killed", "admin: c": "killed", "limit_exceeded:run.cost": "halted",
                     "balance_exhausted": "halted", "sut_unavailable: d": "halted", "unknown": "halted",
                     None: "halted"}


def _literals(tree: ast.AST) -> list[ast.Constant]:
    """The module's string constants, docstrings left out; an f-string contributes its leading text."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    # an attribute docstring (a string statement after an assignment) is documentation too
    docstrings |= {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)
                   and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}
    inner = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values[1:]}
    return [node for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings and id(node) not in inner]


def _sources() -> list[tuple[str, ast.AST]]:
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in HOMES or "/migrations/" in rel:
                continue
            out.append((rel, ast.parse(path.read_text(), filename=rel)))
    return out


def test_no_halt_reason_or_event_type_literal_outside_its_home() -> None:
    found = []
    for rel, tree in _sources():
        for node in _literals(tree):
            if node.value in EVENT_TYPES:
                found.append(f"{rel}:{node.lineno}: event type {node.value!r} (use {node.value}.type_name())")
            elif HALT_LITERAL.match(node.value) and (rel, node.value) not in NOT_HALTS:
                found.append(f"{rel}:{node.lineno}: halt reason {node.value!r} (use benchwright.runs.halts.HaltReason)")
    assert not found, "\n".join(found)


def test_the_lint_sees_what_it_bans() -> None:
    """The scan above is only worth something if it flags the spellings it exists to ban."""
    tree = ast.parse('x.startswith("operator_pause")\nf"agent_review: {r}"\ny == "PhaseStarted"\n"admin"\n')
    values = [node.value for node in _literals(tree)]
    assert [v for v in values if HALT_LITERAL.match(v)] == ["operator_pause", "agent_review: "]
    assert [v for v in values if v in EVENT_TYPES] == ["PhaseStarted"]
