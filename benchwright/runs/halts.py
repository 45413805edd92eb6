"""The halt vocabulary (§9), in one place: every halt reason a run can carry, how it reads on the wire, which ones a
run comes back from, and what ``display_status`` it shows.

On the wire (``halt_reason`` on the run row, ``RunHalted``, the API) a reason is its kind, optionally followed by a
detail: ``operator_pause``, ``operator_kill: too slow``, ``admin: <why>``, ``agent_review: <reason>``,
``restart_cap_exceeded: <reason>``, ``limit_exceeded:run.cost`` (a limit names its level and quantity after a bare
colon), ``balance_exhausted``, ``sut_unavailable: <plain words>``. :meth:`HaltReason.wire` renders that string and
:meth:`HaltReason.parse` reads it back, matching the kind by prefix as §9 asks (never by equality). Code outside
this module builds and matches reasons through :class:`HaltReason`, never through string literals
(``tests/domain/test_vocabulary.py`` keeps it so).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

__all__ = ["HALTED_ERROR", "RESUMABLE", "HaltKind", "HaltReason", "halt_kind", "is_resumable", "limit_exceeded"]


class HaltKind(StrEnum):
    OPERATOR_PAUSE = "operator_pause"
    """Paused by its operator (``POST /v1/runs/{id}/pause``); resumed by ``/resume``."""
    AGENT_REVIEW = "agent_review"
    """The Driver asked for a human review (requestHumanReview); cleared by a review resolution."""
    RESTART_CAP_EXCEEDED = "restart_cap_exceeded"
    """The Driver asked for more phase restarts than a run may have; parked for a human like a review."""
    OPERATOR_KILL = "operator_kill"
    """Stopped for good by its operator."""
    ADMIN = "admin"
    """Halted by a platform administrator."""
    LIMIT_EXCEEDED = "limit_exceeded"
    """A run or phase ceiling of the launch was crossed (detail: ``<level>.<quantity>``)."""
    BALANCE_EXHAUSTED = "balance_exhausted"
    """The account's balance ran out."""
    SUT_UNAVAILABLE = "sut_unavailable"
    """The model's calls kept failing fatally during Materialize (``benchwright.llm.breaker``)."""


RESUMABLE: frozenset[HaltKind] = frozenset({HaltKind.AGENT_REVIEW, HaltKind.OPERATOR_PAUSE,
                                            HaltKind.RESTART_CAP_EXCEEDED})
"""The halts a run can come back from; every other halt tears the run down."""

HaltDisplay = Literal["paused", "waiting", "killed", "halted"]
_DISPLAY: dict[HaltKind, HaltDisplay] = {
    HaltKind.OPERATOR_PAUSE: "paused",
    HaltKind.AGENT_REVIEW: "waiting",
    HaltKind.RESTART_CAP_EXCEEDED: "waiting",
    HaltKind.OPERATOR_KILL: "killed",
    HaltKind.ADMIN: "killed",
}

HALTED_ERROR = "RunHalted"
"""The ApplicationError type of an activity stopped because its run was halted (``benchwright.runs.materialize
.RunHalted``; the row is already halted, so the workflow never retries it)."""


@dataclass(frozen=True)
class HaltReason:
    """One halt reason: its kind and the optional detail that follows it on the wire."""

    kind: HaltKind
    detail: str | None = None

    def wire(self) -> str:
        """The §9 string: ``kind``, ``kind: detail``, or ``limit_exceeded:<level>.<quantity>``."""
        if self.detail is None:
            return self.kind.value
        return f"{self.kind.value}{':' if self.kind is HaltKind.LIMIT_EXCEEDED else ': '}{self.detail}"

    def __str__(self) -> str:
        return self.wire()

    @classmethod
    def parse(cls, text: str | None) -> HaltReason | None:
        """The reason a wire string names (its kind matched by prefix), or None for none or an unknown one."""
        if not text:
            return None
        for kind in HaltKind:
            if text.startswith(kind.value):
                rest = text[len(kind.value):]
                if not rest:
                    return cls(kind)
                rest = rest[1:] if rest.startswith(":") else rest
                return cls(kind, rest[1:] if rest.startswith(" ") else rest)
        return None

    @property
    def resumable(self) -> bool:
        return self.kind in RESUMABLE

    @property
    def display(self) -> HaltDisplay:
        """The ``display_status`` a run halted for this reason shows."""
        return _DISPLAY.get(self.kind, "halted")


def halt_kind(reason: str | None) -> HaltKind | None:
    """The kind of a wire reason (matched by prefix), or None for none or an unknown one."""
    parsed = HaltReason.parse(reason)
    return parsed.kind if parsed is not None else None


def is_resumable(reason: str | None, *, kinds: frozenset[HaltKind] = RESUMABLE) -> bool:
    """Whether a wire reason is one of ``kinds`` (by default: the reasons a run comes back from)."""
    return halt_kind(reason) in kinds


def limit_exceeded(ceiling: str) -> str:
    """``limit_exceeded:<ceiling>`` (``run.cost``, ``phase:atomize.duration``...)."""
    return HaltReason(HaltKind.LIMIT_EXCEEDED, ceiling).wire()
