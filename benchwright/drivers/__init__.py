"""Drivers (§8): the seam in ``base`` and the offline ``builtin`` driver; the LLM driver registers itself as ``llm``.

Importing this package registers ``builtin``, so ``driver_for("builtin")`` always works.
"""

from benchwright.drivers import builtin as _builtin  # noqa: F401  (registers ``builtin``)
from benchwright.drivers.base import (
    AnalyzeDecision,
    AtomizeDecision,
    DatasetSchema,
    Driver,
    DriverContext,
    DriverFailed,
    FindDecision,
    SampleResult,
    ScorerPlan,
    SubsetChoice,
    Workbench,
    driver_for,
    driver_kind,
    register_driver,
)

__all__ = [
    "AnalyzeDecision",
    "AtomizeDecision",
    "DatasetSchema",
    "Driver",
    "DriverContext",
    "DriverFailed",
    "FindDecision",
    "SampleResult",
    "ScorerPlan",
    "SubsetChoice",
    "Workbench",
    "driver_for",
    "driver_kind",
    "register_driver",
]
