"""Benchwright: evaluate a model against a benchmark as one durable run.

"§N" in comments and docstrings across the code refers to section N of docs/concepts.md."""
