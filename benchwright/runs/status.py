"""The one rule that folds (status, halted, halt_reason) into ``display_status`` (§1, §9).

| halted | halt_reason prefix                      | display_status          |
|--------|-----------------------------------------|-------------------------|
| no     | -                                       | status (running/ok/error) |
| yes    | operator_pause                          | paused                  |
| yes    | agent_review, restart_cap_exceeded      | waiting                 |
| yes    | operator_kill, admin                    | killed                  |
| yes    | limit_exceeded, balance_exhausted, other | halted                 |

``running`` is what an unhalted run in flight shows; the other six values are the ones §1 names.
Reasons carry suffixes (``operator_kill: too slow``), so they are matched by prefix, never by equality.
"""

from __future__ import annotations

from benchwright.runs.halts import HaltReason
from benchwright.schemas import DisplayStatus


def display_status(*, status: str, halted: bool, halt_reason: str | None) -> DisplayStatus:
    """Fold the stored run fields into the one status a person should read."""
    if not halted:
        return status  # type: ignore[return-value]
    reason = HaltReason.parse(halt_reason)
    return reason.display if reason is not None else "halted"
