"""The ``benchwright`` command line, one module per command group:

* ``app``: the root Typer app, the run commands (launch, runs, status, events, tasks, results...) and ``main``;
* ``accounts``, ``answers`` (show, compare, frontier, schedule), ``demo``, ``find``, ``forks``, ``keys``,
  ``operator``, ``registry``, ``report``, ``secrets``, ``sessions``: the other groups and commands;
* ``support``: what they share (the client, data directory, tables, watching a run).

``python -m benchwright.cli`` and the ``benchwright`` console script (``benchwright.cli:main``) both run ``main``.
This module imports nothing, so a command module's own imports (``benchwright.cli.support``) stay light.
"""

from __future__ import annotations


def main() -> None:
    """The ``benchwright`` console script (``benchwright.cli.app.main``)."""
    from benchwright.cli.app import main as run

    run()
