"""A run's life in the domain (§1, §2, §9, §10): the one start path (``launch``) and the one control path (``control``),
the pipeline's plan and its activities' inputs and results (``pipeline``), the launch ceilings (``limits``), the
typed halt vocabulary (``halts``), the one rule for a run's display status (``status``); forks, replays and sweeps
(``forks``), the phases' hand-off of work files (``handoff``) and their side of the cross-run cache
(``phase_cache``), and Materialize's batches (``materialize``) and where their trials run (``placement``).

This module imports nothing: import the module you need (``from benchwright.runs.launch import start_run``).
"""
