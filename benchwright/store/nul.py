"""NUL characters, which Postgres holds in no text column (nor a ``\\u0000`` in JSON that ``->>`` can read): the store
replaces each with U+FFFD, the replacement character, on Postgres (an endpoint under test may well answer with one);
SQLite keeps them (``benchwright.store.events.storable_on_postgres``)."""

from __future__ import annotations

from typing import Any

NUL, REPLACEMENT = "\x00", "\ufffd"


def has_nul(value: Any) -> bool:
    """Whether ``value`` (JSON-like) holds a NUL character in a string or a key."""
    if isinstance(value, str):
        return NUL in value
    if isinstance(value, dict):
        return any(NUL in key or has_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(has_nul(item) for item in value)
    return False


def without_nul(value: Any) -> Any:
    """``value`` (JSON-like) with each NUL character in its strings and keys replaced by U+FFFD."""
    if isinstance(value, str):
        return value.replace(NUL, REPLACEMENT)
    if isinstance(value, dict):
        return {key.replace(NUL, REPLACEMENT): without_nul(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_nul(item) for item in value]
    return value
