"""Live SSE streams of event logs: one reader per log fans it out to every stream on it (issue 15 item 9).

A hub streams one kind of log (an ``EventLog``): a run's (``RUN_LOG``, ``GET /v1/runs/{id}/events``) or an Operator
session's (``GET /v1/operator/sessions/{id}/events``, issue 26). What follows says "run" for either.

Each stream used to poll the store every 0.1 s in the threadpool and format every event per stream. With 200
streams on a live 3,000-task run (6,033 events) that cost ~66 µs of API CPU per event per stream (80 s in all), the
streams delivered their last event 84–88 s after the run ended, ``GET /v1/runs/{id}`` waited 10 s at the median
(the streams held the threadpool and the store's connection pool), and the API grew from 122 to 807 MB.

Now a ``RunFeed`` per run with streams on it reads the store once per tick for all of them, formats each event's
frame once, and keeps the frames in blocks of up to ``block_bytes``: a bounded window (``buffer_bytes``) shared by
every stream on the run. Each stream is a cursor (the last seq it sent) into that window:

- at the tail, it waits for the reader's next blocks and sends each as one chunk (the same bytes object for every
  stream; a stream mid-block sends the block's tail);
- behind the window (it resumed from an old ``Last-Event-ID``, or it read so slowly that the window moved past it),
  it catches up from the store in pages, through a small pool of store reads of its own so catch-ups never starve
  the API's other requests, and joins the window when it reaches it. Positions are seqs, so there are no gaps and
  no duplicates at the seam;
- a stream that reads nothing holds one block at most: the server's send waits for the socket (flow control), so
  a stalled client costs its socket buffer and a cursor, never a growing queue.

A stream closes after the run's terminal event. The reader stops after reading it, and the feed is dropped when its
last stream goes, so nothing polls a run nobody watches. Every store read runs in a worker thread (anyio), never
on the event loop.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from anyio import CapacityLimiter, to_thread
from fastapi.exceptions import RequestValidationError
from sqlalchemy.engine import Engine

from benchwright.errors import Unavailable
from benchwright.events import TERMINAL_EVENT
from benchwright.operator.events import SessionAnswered
from benchwright.schemas import EventView
from benchwright.store.events import read_events, terminal_seq

KEEPALIVE = b": keep-alive\n\n"
_EVENT_ID = re.compile(r"-?\d{1,19}")


class LogRow(Protocol):
    """One stored event of a log (``EventRow``, ``OperatorEvent``)."""

    seq: int
    type: str
    data: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True)
class EventLog:
    """A kind of append-only log a hub streams: how to read it, and the event that ends it."""

    noun: str
    """What one log is, in messages ("run", "operator session")."""
    read: Callable[[Engine, str, int, int], Sequence[LogRow]]
    """``(engine, log id, after, limit)``: the events with seq > after in seq order, at most limit."""
    terminal: str
    """The type of the log's terminal event: a live stream closes after it."""
    terminal_seq: Callable[[Engine, str], int | None]
    """The seq of the log's terminal event, or None while it has none."""


RUN_LOG = EventLog(noun="run", read=lambda engine, run_id, after, limit: read_events(engine, run_id, after=after,
                                                                                    limit=limit),
                   terminal=TERMINAL_EVENT, terminal_seq=terminal_seq)


def _session_terminal_seq(engine: Engine, session_id: str) -> int | None:
    from sqlmodel import Session, col, select

    from benchwright.store.models import OperatorEvent

    with Session(engine) as session:
        return session.exec(select(OperatorEvent.seq).where(
            col(OperatorEvent.session_id) == session_id, col(OperatorEvent.type) == SessionAnswered.__name__)
            .order_by(col(OperatorEvent.seq)).limit(1)).first()


def _read_session_events(engine: Engine, session_id: str, after: int, limit: int) -> Sequence[LogRow]:
    from benchwright.operator.store import read_session_events

    return read_session_events(engine, session_id=session_id, after=after, limit=limit)


SESSION_LOG = EventLog(noun="operator session", read=_read_session_events, terminal=SessionAnswered.__name__,
                       terminal_seq=_session_terminal_seq)
"""An Operator session's log (issue 26): it ends with SessionAnswered."""


@dataclass(frozen=True)
class Frame:
    """One event as its SSE frame (``id`` = seq), formatted once for every stream."""

    seq: int
    terminal: bool
    data: bytes


def frames(engine: Engine, run_id: str, *, after: int, limit: int, log: EventLog = RUN_LOG) -> list[Frame]:
    """The log's events after ``after`` (at most ``limit``) as SSE frames, up to and including the terminal event.

    Runs in a worker thread: the read and the JSON encoding stay off the event loop.
    """
    out: list[Frame] = []
    for row in log.read(engine, run_id, after, limit):
        out.append(Frame(seq=row.seq, terminal=row.type == log.terminal, data=_frame_bytes(row)))
        if row.type == log.terminal:
            break
    return out


def _frame_bytes(row: LogRow) -> bytes:
    view = EventView(seq=row.seq, type=row.type, data=row.data, created_at=row.created_at)
    return f"id: {row.seq}\nevent: {row.type}\ndata: ".encode() + view.model_dump_json().encode() + b"\n\n"


def resume_point(*, last_event_id: str | None, after: int, last_seq: int, noun: str = "run") -> int:
    """Where a stream starts: after ``Last-Event-ID`` when the client sends one, else after ``after``.

    A stream's position must be an event the run has: an id the server sent is never past the log's end, and a
    stream positioned past it would wait for an event that never comes. So ``Last-Event-ID`` must be an integer from
    -1 to the run's last seq (and so must ``after``, for a stream); anything else is a 422 naming the value and the
    range, the answer FastAPI gives for a malformed parameter.

    Raises:
        RequestValidationError: a malformed or out-of-range ``Last-Event-ID`` (or stream ``after``).
    """
    if last_event_id is not None and last_event_id.strip():
        raw = last_event_id.strip()
        start = int(raw) if _EVENT_ID.fullmatch(raw) else None
        if start is None or not -1 <= start <= last_seq:
            _refuse(("header", "last-event-id"), raw, last_seq, noun)
        assert start is not None
        return start
    if after > last_seq:
        _refuse(("query", "after"), str(after), last_seq, noun)
    return after


def _refuse(loc: tuple[str, str], value: str, last_seq: int, noun: str) -> None:
    shown = value if len(value) <= 40 else value[:40] + "..."
    msg = (f"must be the id (seq) of an event of this {noun}, from -1 to {last_seq} (its last event so far); "
           f"got {shown!r}")
    raise RequestValidationError([{"loc": loc, "type": "value_error", "msg": msg, "input": shown}])


@dataclass(frozen=True)
class _Block:
    """Consecutive frames joined into one chunk: seqs ``first``.. ``first + len(starts) - 1``."""

    first: int
    data: bytes
    starts: tuple[int, ...]
    """Offset in ``data`` of each frame."""
    terminal: bool

    @property
    def last(self) -> int:
        return self.first + len(self.starts) - 1

    def after(self, seq: int) -> bytes:
        """The frames with seq > ``seq`` (the whole block when it starts after ``seq``)."""
        return self.data if seq < self.first else self.data[self.starts[seq + 1 - self.first]:]


def _blocks(batch: list[Frame], limit: int) -> list[_Block]:
    out: list[_Block] = []
    group: list[Frame] = []
    size = 0
    for frame in batch:
        if group and size + len(frame.data) > limit:
            out.append(_block(group))
            group, size = [], 0
        group.append(frame)
        size += len(frame.data)
    if group:
        out.append(_block(group))
    return out


def _block(group: list[Frame]) -> _Block:
    starts, at = [], 0
    for frame in group:
        starts.append(at)
        at += len(frame.data)
    return _Block(first=group[0].seq, data=b"".join(f.data for f in group), starts=tuple(starts),
                  terminal=group[-1].terminal)


@dataclass
class RunFeed:
    """One run's reader and the window of its latest frames, shared by every stream on the run."""

    run_id: str
    tail: int
    """The last seq read; the reader starts after the first stream's position."""
    blocks: list[_Block] = field(default_factory=list)
    size: int = 0
    terminal: int | None = None
    """The terminal event's seq, once read; nothing after it is read."""
    error: BaseException | None = None
    streams: int = 0
    version: int = 0
    """Bumped whenever there is something new to look at (frames, an error, the hub closing)."""
    waiters: dict[asyncio.Future[None], None] = field(default_factory=dict)
    reader: asyncio.Task[None] | None = None
    wakers: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def base(self) -> int:
        """The first seq in the window (``tail + 1`` when it is empty)."""
        return self.blocks[0].first if self.blocks else self.tail + 1

    def since(self, seq: int) -> list[_Block]:
        """The window's blocks holding frames after ``seq`` (``seq + 1 >= base``)."""
        i = len(self.blocks)
        while i > 0 and self.blocks[i - 1].last > seq:
            i -= 1
        return self.blocks[i:]

    def add(self, blocks: list[_Block], *, max_bytes: int) -> None:
        for block in blocks:
            self.blocks.append(block)
            self.size += len(block.data)
            self.tail = block.last
            if block.terminal:
                self.terminal = block.last
        while self.size > max_bytes and len(self.blocks) > 1:
            self.size -= len(self.blocks.pop(0).data)
        self.notify()

    async def wait(self, timeout: float) -> bool:
        """Wait for the next ``notify``; False when ``timeout`` passed first."""
        waiter = asyncio.get_running_loop().create_future()
        self.waiters[waiter] = None
        try:
            async with asyncio.timeout(timeout):
                await waiter
            return True
        except TimeoutError:
            return False
        finally:
            self.waiters.pop(waiter, None)

    def notify(self) -> None:
        """Wake the streams waiting now, ``WAKE_GROUP`` per event-loop turn.

        A woken stream costs ~58 µs of API CPU (its send through Starlette and uvicorn; bench/sse.py), so waking 200
        at once is one ~12 ms loop turn that every other request waits behind; in groups, the loop polls its
        sockets between groups and a ``GET /v1/runs/{id}`` is served among them.
        """
        self.version += 1
        waiters = list(self.waiters)
        self.waiters.clear()
        if len(waiters) <= WAKE_GROUP:
            _wake(waiters)
            return
        waker = asyncio.create_task(_wake_in_groups(waiters))
        self.wakers.add(waker)
        waker.add_done_callback(self.wakers.discard)


WAKE_GROUP = 16
"""Streams woken per event-loop turn."""


def _wake(waiters: list[asyncio.Future[None]]) -> None:
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


async def _wake_in_groups(waiters: list[asyncio.Future[None]]) -> None:
    for start in range(0, len(waiters), WAKE_GROUP):
        _wake(waiters[start:start + WAKE_GROUP])
        await asyncio.sleep(0)


class SseHub:
    """The feeds of the logs (of one kind) that have streams open in this API process."""

    def __init__(self, engine: Engine, *, log: EventLog = RUN_LOG, poll_s: float = 0.1, keepalive_s: float = 15.0,
                 buffer_bytes: int = 8 << 20, block_bytes: int = 64 << 10, page: int = 1000,
                 catchup_page: int = 500, catchup_reads: int = 4) -> None:
        """Args:
            engine: The store.
            log: The kind of log streamed (runs' by default).
            poll_s: A feed's reader reads the store this often while the run is quiet.
            keepalive_s: A stream with nothing to send for this long sends an SSE comment.
            buffer_bytes: The most a feed keeps of frames already read (8 MiB held all 6,033 events of a 3,000-task
                run, so streams opened at the launch never touch the store).
            block_bytes: The most one chunk holds (the most a stalled stream pins).
            page: Events per store read of a reader.
            catchup_page: Events per store read of a stream behind the window.
            catchup_reads: Store reads of streams behind their window at one time, over all runs.
        """
        self._engine, self._log = engine, log
        self._poll_s, self._keepalive_s = poll_s, keepalive_s
        self._buffer_bytes, self._block_bytes = buffer_bytes, block_bytes
        self._page, self._catchup_page = page, catchup_page
        self._catchup = CapacityLimiter(catchup_reads)
        self._feeds: dict[str, RunFeed] = {}
        self._closed = False
        self.catchups = 0
        """Store reads by streams behind their window, since the start (for operators and tests)."""

    def feed(self, run_id: str) -> RunFeed | None:
        """The run's live feed, if streams are open on it (for tests and operators)."""
        return self._feeds.get(run_id)

    async def stream(self, *, log_id: str, after: int, finished: bool) -> AsyncIterator[bytes]:
        """The log's SSE frames after seq ``after``, closing after the terminal event.

        Args:
            log_id: The run (or session; the caller checked access).
            after: The last seq the client has (-1: from the start).
            finished: The run had finished when the request was read: a client that already has the terminal
                event gets what was appended after it (the proxy's linger, a scheduled replay's
                RegressionDetected, a refused control signal) and the stream closes; a live stream closes at the
                terminal event itself, so these reach it on its next reconnect. A finished log with no terminal
                event (a session whose workflow could not start) sends what it has and closes.
        """
        run_id = log_id
        if finished:
            end = await to_thread.run_sync(self._log.terminal_seq, self._engine, run_id, limiter=self._catchup)
            if end is not None and after >= end:
                tail = await to_thread.run_sync(self._appendix, run_id, after, limiter=self._catchup)
                if tail:
                    yield b"".join(tail)
                return
            while end is None:  # over without its terminal event: nothing more will come
                batch = await to_thread.run_sync(self._frames, run_id, after, self._catchup_page,
                                                 limiter=self._catchup)
                if not batch:
                    return
                yield b"".join(f.data for f in batch)
                after = batch[-1].seq
        feed = self._join(run_id, after)
        try:
            while not self._closed:
                seen = feed.version
                if feed.terminal is not None and after >= feed.terminal:
                    return
                sent = False
                if after + 1 < feed.base:  # behind the window: catch up from the store
                    self.catchups += 1
                    batch = await to_thread.run_sync(self._frames, run_id, after, self._catchup_page,
                                                     limiter=self._catchup)
                    if batch:
                        yield b"".join(f.data for f in batch)
                        after, sent = batch[-1].seq, True
                        if batch[-1].terminal:
                            return
                else:
                    for block in feed.since(after):
                        yield block.after(after)
                        after, sent = block.last, True
                if sent or feed.version != seen:
                    continue
                if feed.error is not None:
                    raise Unavailable(f"the event feed of {self._log.noun} {run_id} failed: "
                                      f"{feed.error}") from feed.error
                if not await feed.wait(self._keepalive_s):
                    yield KEEPALIVE
        finally:
            self._leave(feed)

    async def close(self) -> None:
        """Stop every reader and end every stream (the API is shutting down)."""
        self._closed = True
        feeds = list(self._feeds.values())
        for feed in feeds:
            feed.notify()
            if feed.reader is not None:
                feed.reader.cancel()
        await asyncio.gather(*(f.reader for f in feeds if f.reader is not None), return_exceptions=True)

    def _frames(self, run_id: str, after: int, limit: int) -> list[Frame]:
        return frames(self._engine, run_id, after=after, limit=limit, log=self._log)

    def _appendix(self, run_id: str, after: int) -> list[bytes]:
        """Frames of the events a finished run's log gained after its terminal event (a handful at most)."""
        rows = self._log.read(self._engine, run_id, after, self._catchup_page)
        return [_frame_bytes(row) for row in rows]

    def _join(self, run_id: str, after: int) -> RunFeed:
        feed = self._feeds.get(run_id)
        if feed is None:
            feed = self._feeds[run_id] = RunFeed(run_id=run_id, tail=after)
            feed.reader = asyncio.create_task(self._read(feed), name=f"sse-feed-{run_id}")
        feed.streams += 1
        return feed

    def _leave(self, feed: RunFeed) -> None:
        feed.streams -= 1
        if feed.streams == 0:
            if self._feeds.get(feed.run_id) is feed:
                del self._feeds[feed.run_id]
            if feed.reader is not None:
                feed.reader.cancel()

    async def _read(self, feed: RunFeed) -> None:
        """The feed's reader: one store read per tick for every stream on the run, until the terminal event."""
        try:
            while feed.terminal is None:
                batch = await to_thread.run_sync(self._frames, feed.run_id, feed.tail, self._page)
                if batch:
                    feed.add(_blocks(batch, self._block_bytes), max_bytes=self._buffer_bytes)
                if len(batch) < self._page and feed.terminal is None:
                    await asyncio.sleep(self._poll_s)
        except Exception as exc:  # noqa: BLE001 - the streams end with it; the next stream starts a fresh feed
            feed.error = exc
            if self._feeds.get(feed.run_id) is feed:
                del self._feeds[feed.run_id]
            feed.notify()


__all__ = ["KEEPALIVE", "RUN_LOG", "SESSION_LOG", "EventLog", "Frame", "LogRow", "RunFeed", "SseHub", "frames",
           "resume_point"]
