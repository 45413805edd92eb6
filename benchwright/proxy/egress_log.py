"""Where the egress proxy records refused hosts: the :class:`BlockedHostRecorder` protocol and the in-memory log
used by tests and dev (the product's recorder writes the account's blocked-host table)."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from benchwright.proxy.policy import normalize_host

__all__ = ["BlockedHostRecorder", "InMemoryBlockedLog"]


@runtime_checkable
class BlockedHostRecorder(Protocol):
    """Receives every host the proxy refused. ``record`` may be a plain or an ``async`` method.

    The proxy passes the canonical host (see :func:`~benchwright.proxy.policy.normalize_host`) without port, and
    awaits the result when it is awaitable. A sync implementation runs on the proxy's event loop, so it must not
    block (hand slow work to a thread or make ``record`` async). Exceptions are logged; the request is refused
    regardless.
    """

    def record(self, host: str) -> Awaitable[None] | None:
        """Record one refusal of ``host``."""
        ...


def _utcnow() -> datetime:
    return datetime.now(UTC)


class InMemoryBlockedLog:
    """A :class:`BlockedHostRecorder` keeping one entry per host in memory (tests, dev, reference semantics).

    Thread-safe, so a test or API thread may read :meth:`entries` while the proxy records.
    """

    def __init__(self, *, clock: Callable[[], datetime] = _utcnow) -> None:
        """Create an empty log.

        Args:
            clock: Returns the current time; must be timezone-aware (UTC). Injectable for tests.
        """
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, dict[str, Any]] = {}

    def record(self, host: str) -> None:
        """Count one refusal of ``host``: creates the entry or bumps ``seen_count`` and ``last_seen``."""
        try:
            host = normalize_host(host)
        except ValueError:
            pass  # record what we were given; a refusal must never go unrecorded because the name is odd
        now = self._clock()
        with self._lock:
            entry = self._entries.get(host)
            if entry is None:
                self._entries[host] = {"host": host, "seen_count": 1, "first_seen": now, "last_seen": now}
            else:
                entry["seen_count"] += 1
                entry["last_seen"] = now

    def entries(self) -> list[dict[str, Any]]:
        """Snapshot of the log in first-seen order.

        Returns:
            Copies of ``{"host", "seen_count", "first_seen", "last_seen"}`` dicts (aware UTC datetimes).
        """
        with self._lock:
            return [dict(entry) for entry in self._entries.values()]

    def clear(self) -> None:
        """Forget all entries."""
        with self._lock:
            self._entries.clear()
