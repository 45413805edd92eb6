"""Scheduled regression runs (issue 17): Temporal Schedules that replay a reference run and compare."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])
