"""Answers across runs (issue 17): paired comparison, rankings and the cost–quality frontier, the statistics under them,
and scheduled regression replays with their webhook alerts (``compare``, ``stats``, ``regression``, ``webhook``).

This module imports nothing: import the module you need.
"""
