"""The dev model: an OpenAI-compatible loopback test double, now the package :mod:`benchwright.testkit.devmodel`.

This module keeps the old import path working (tests, the CLI, docs and users' scripts import from it).
"""

from __future__ import annotations

from benchwright.testkit.devmodel import (
    UNKNOWN_REPLY,
    DevModelConfig,
    DevModelServer,
    Fault,
    is_answered_correctly,
    load_answers,
    rows_answered_correctly,
    serve,
    start_server,
    wrong_answer,
)

__all__ = [
    "UNKNOWN_REPLY",
    "DevModelConfig",
    "DevModelServer",
    "Fault",
    "is_answered_correctly",
    "load_answers",
    "rows_answered_correctly",
    "serve",
    "start_server",
    "wrong_answer",
]
