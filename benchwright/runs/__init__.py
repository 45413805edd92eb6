"""A run's life in the domain (§1, §2, §9): the one start path (``launch``), the pipeline's plan and its activities'
inputs and results (``pipeline``), the launch ceilings (``limits``), the typed halt vocabulary (``halts``) and the
one rule for a run's display status (``status``).

This module imports nothing: import the module you need (``from benchwright.runs.launch import start_run``).
"""
