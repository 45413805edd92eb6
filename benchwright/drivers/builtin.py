"""The builtin driver: offline, deterministic, no LLM (the embedded stack's default, §8)."""

from __future__ import annotations

from benchwright.drivers.base import (
    AnalyzeDecision,
    AtomizeDecision,
    DriverContext,
    DriverFailed,
    FindDecision,
    register_driver,
)


class BuiltinDriver:
    name = "builtin"

    async def find(self, ctx: DriverContext) -> FindDecision | None:
        raise DriverFailed("not yet")

    async def analyze(self, ctx: DriverContext) -> AnalyzeDecision | None:
        raise DriverFailed("not yet")

    async def atomize(self, ctx: DriverContext) -> AtomizeDecision | None:
        raise DriverFailed("not yet")


register_driver("builtin", lambda name: BuiltinDriver())
