"""``python -m benchwright.cli``: the ``benchwright`` command line."""

from benchwright.cli.app import main

main()
