"""Dependencies of the routes: settings, the store engine, the Temporal client, and the calling account."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.engine import Engine
from starlette.concurrency import run_in_threadpool
from temporalio.client import Client

from api.sse import SESSION_LOG, SseHub
from benchwright.errors import Unavailable
from benchwright.settings import Settings
from benchwright.stack.temporal_client import connect
from benchwright.store.accounts import authenticate
from benchwright.store.models import Account
from benchwright.store.settled import listen_for_settles


class AppState:
    """Built once per app by the lifespan; the Temporal connection is made on first need and then kept."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.sse = SseHub(engine)
        """The live SSE feeds: one store reader per run with streams open, shared by all of them."""
        self.session_sse = SseHub(engine, log=SESSION_LOG)
        """The same for Operator sessions' logs."""
        self._client: Client | None = None
        self._lock = asyncio.Lock()
        self.settled = listen_for_settles(engine)
        """Word from the store as a run's row settles (a NOTIFY on Postgres, a datagram beside an SQLite file): the
        long polls wake on it."""
        if self.settled is not None:
            self.settled.start()

    def settling(self, run_id: str, event: asyncio.Event) -> contextlib.AbstractContextManager[None]:
        """While inside: ``event`` is set when the store says ``run_id``'s row settled (never for SQLite in
        memory)."""
        return self.settled.waiting(run_id, event) if self.settled is not None else contextlib.nullcontext()

    def close(self) -> None:
        if self.settled is not None:
            self.settled.close()

    async def temporal(self) -> Client:
        async with self._lock:
            if self._client is None:
                try:
                    self._client = await connect(self.settings)
                except Exception as exc:  # the SDK raises RuntimeError for connection failures
                    raise Unavailable(f"cannot reach Temporal at {self.settings.temporal_address}: {exc}") from exc
            return self._client


def get_state(request: Request) -> AppState:
    return request.app.state.bw  # type: ignore[no-any-return]


StateDep = Annotated[AppState, Depends(get_state)]


async def current_account(request: Request, state: StateDep) -> Account:
    """The account whose key is in ``Authorization: Bearer <key>``.

    The scheme is matched case-insensitively (``bearer`` and ``BEARER`` work too): RFC 7235 §2.1 makes
    authentication schemes case-insensitive, so refusing one spelling would break conforming clients.
    """
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    token = key.strip() if scheme.lower() == "bearer" else None
    return await run_in_threadpool(authenticate, state.engine, token)


AccountDep = Annotated[Account, Depends(current_account)]
