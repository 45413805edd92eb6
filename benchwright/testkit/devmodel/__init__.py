"""``benchwright dev-model``: a TEST DOUBLE for an OpenAI-compatible chat-completions provider.

This is **not a language model**. It is a tiny, deterministic HTTP server that speaks enough of
the OpenAI chat-completions API for Benchwright to run end to end with no internet and no API key:
the offline demo, the integration tests and the throughput benchmarks all point at it.

How it answers:

* It is given a table ``question -> correct answer`` (usually from a JSONL file, see
  :func:`load_answers`) and an ``accuracy`` P in [0, 1].
* For each request it takes the last ``user`` message, finds the question in it (exact match of the
  stripped text first, else the longest known question contained in the text), and replies with the
  correct answer for a hash-chosen fraction P of the questions and with a deterministic, plausible
  wrong answer (:func:`wrong_answer`) for the rest. The verdict depends only on the question text
  (:func:`is_answered_correctly`), so a run's score is reproducible and ≈ P.
* An unknown question gets ``"I don't know."``.

Endpoints: ``POST /v1/chat/completions`` (and ``/chat/completions``; ``stream: true`` supported),
``GET /v1/models`` (and ``/models``), ``GET /health``. Authentication is not required unless
``api_key`` is configured; otherwise any ``Authorization`` header is accepted and ignored.

Fault modes, for tests of how callers meet a sick provider: ``known_models_only`` answers 404
``model_not_found`` for a model other than ``model_name`` (as OpenAI does), and ``faults`` make a
window of chat requests (counted from 0 in arrival order) answer 401, 403, 429 (with ``Retry-After``),
500 or 503 in OpenAI's error shape. ``DevModelServer.chat_statuses`` counts what was answered.

The server is a raw ``asyncio.Protocol`` HTTP/1.1 server on ``httptools`` (uvicorn's C parser), not
a framework app, because its CPU per request is what benchmarks measure: they drive it at 128+
concurrent requests on small machines, and a single-threaded server that spends 100 µs per request
answers a wave of 128 simultaneous requests over ~13 ms instead of at once, inflating the baseline.
Every reply is decided at start-up; a request's answer bytes are built as soon as it is parsed and
written by a ``loop.call_later`` timer once the latency has passed (no task or coroutine per
request). Measured with 128 requests in flight and 50 ms latency on 2 cores (uvloop): ~40 µs of
server CPU per request, against ~75-125 µs for the Starlette-on-uvicorn version it replaced. The HTTP
behaviour is that version's: keep-alive, pipelined requests answered in order, ``Expect:
100-continue``, chunked bodies, HEAD on GET routes, the trailing-slash redirect, and 404/405 in
OpenAI's error shape; a malformed request gets 400, a head over 64 KiB 431 and a body over 64 MiB 413, each closing
the connection. The protocol itself is ``benchwright.llm.httpserver``, which the credential proxy serves with too.
:func:`serve` runs it as a process, :func:`start_server` in a running event loop.

Modules: :mod:`.config` (settings and fault windows), :mod:`.answers` (answer table, verdicts, wrong answers),
:mod:`.replies` (request parsing and response bodies), :mod:`.protocol` (the routes on the HTTP/1.1 protocol),
:mod:`.server` (starting and serving). ``benchwright.testkit.devmodel`` re-exports this package's public names.
"""

from __future__ import annotations

from benchwright.testkit.devmodel.answers import (
    is_answered_correctly,
    load_answers,
    rows_answered_correctly,
    wrong_answer,
)
from benchwright.testkit.devmodel.config import UNKNOWN_REPLY, DevModelConfig, Fault
from benchwright.testkit.devmodel.server import DevModelServer, serve, start_server

__all__ = [
    "UNKNOWN_REPLY",
    "DevModelConfig",
    "DevModelServer",
    "Fault",
    "is_answered_correctly",
    "load_answers",
    "rows_answered_correctly",
    "serve",
    "start_server",
    "wrong_answer",
]
