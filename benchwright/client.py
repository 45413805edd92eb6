"""The Python SDK: a thin, typed client of the REST API.

    from benchwright.client import Client
    bw = Client.from_data_dir()                      # the embedded stack's dev.json, or pass api_url / api_key
    run = bw.launch(dataset="gsm8k.jsonl", model="openai/gpt-4o-mini")
    final = bw.wait(run["id"])
    print(final["tasks"]["summary"]["pass_rate"])
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

import httpx

from benchwright.events import TERMINAL_EVENT
from benchwright.schemas import RETIRED_LAUNCH_KEYS
from benchwright.settings import default_data_dir


class ApiError(Exception):
    """The API refused a call; ``code`` and ``message`` come from its ``{"error": ...}`` body."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


def read_dev_json(data_dir: Path | None = None) -> dict[str, Any]:
    """The running embedded stack's addresses and dev API key (written by ``benchwright up``)."""
    path = (data_dir or Path(os.environ.get("BENCHWRIGHT_DATA_DIR", default_data_dir()))) / "dev.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: start the stack with 'benchwright up' "
                                "(or pass --api-url/--api-key)")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _raise_for(resp: httpx.Response) -> None:
    """Raise the API's ``{"error": ...}`` answer as ApiError (any 4xx/5xx; a body that is not ours is quoted)."""
    if resp.status_code < 400:
        return
    try:
        err = resp.json()["error"]
        code, message = str(err.get("code", "error")), str(err.get("message", resp.text))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ApiError(resp.status_code, "http_error", resp.text) from None
    raise ApiError(resp.status_code, code, message)


SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
"""A secret's name, as ``POST /v1/secrets`` admits it."""
RUN_ID_LENGTH = 36
"""A full run id (a UUID). Anything shorter is a prefix, resolved by ``Client.resolve_run_id``."""
MIN_PREFIX = 4
AMBIGUOUS_SHOWN = 10
"""An ambiguous prefix's refusal lists at most this many of the runs it matches."""
WAIT_HOLD_S = 20.0
"""Longest single long poll of ``Client.wait`` (kept below the HTTP timeout)."""
SSE_RECONNECTS = 8
"""Consecutive failed connections ``stream_events`` tolerates (backing off 0.25 s doubling to 5 s) before it gives
up; any event received resets the count."""


class Client:
    def __init__(self, api_url: str, api_key: str, *, timeout: float = 60.0) -> None:
        self._http = httpx.Client(base_url=api_url.rstrip("/"), headers={"Authorization": f"Bearer {api_key}"},
                                  timeout=timeout)

    @classmethod
    def from_data_dir(cls, data_dir: Path | None = None) -> Client:
        dev = read_dev_json(data_dir)
        return cls(dev["api_url"], dev["api_key"])

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiError(0, "unreachable", f"cannot reach the API at {self._http.base_url}: {exc}") from exc
        _raise_for(resp)
        return resp.json()

    def resolve_run_id(self, ref: str) -> str:
        """The full id of the caller's one run whose id starts with ``ref`` (tables show 8 characters); a full id is
        returned as it is, without a call. Resolution goes over the caller's own runs only
        (``GET /v1/runs?id_prefix=``), so another account's run is never found by a prefix: name it by its full id.

        Raises:
            ApiError: 404 ``not_found`` (no run of yours starts so), 409 ``ambiguous_run_id`` (several do; the message
                lists them).
        """
        text = ref.strip().lower()
        if not MIN_PREFIX <= len(text) < RUN_ID_LENGTH or text.strip("0123456789abcdef-"):
            return ref  # a full id, or no run's prefix: its route answers (404: no such run)
        found = self._call("GET", "/v1/runs", params={"id_prefix": text, "limit": AMBIGUOUS_SHOWN + 1})["runs"]
        if not found:
            raise ApiError(404, "not_found", f"no run of yours has an id starting with {text!r} (another account's "
                                             "run is found by its full id only)")
        if len(found) > 1:
            shown = "; ".join(f"{r['id']} ({r['model']}, {str(r['created_at'])[:19]})" for r in found[:AMBIGUOUS_SHOWN])
            more = " and more" if len(found) > AMBIGUOUS_SHOWN else ""
            raise ApiError(409, "ambiguous_run_id", f"{text!r} starts the ids of several of your runs: {shown}{more}; "
                                                    "give more characters")
        return str(found[0]["id"])

    def _rid(self, ref: str) -> str:
        """``resolve_run_id`` for a URL path: quoted, so no text given as a run id can steer the request's path."""
        return quote(self.resolve_run_id(ref), safe="")

    def launch(self, *, model: str | dict[str, Any], dataset: str | None = None, driver: str | None = None,
               task_impl: str | None = None, trials: dict[str, Any] | None = None,
               metadata: dict[str, Any] | None = None, visibility: str | None = None,
               concurrency: int | None = None, limits: dict[str, Any] | None = None,
               constraints: dict[str, Any] | None = None, compute: str | None = None,
               requirements: list[str] | None = None, harness: str | None = None,
               harness_config: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        """Launch a run (``POST /v1/runs``); the arguments are the launch body's keys (``LaunchRequest``).
        ``harness="inspect"`` or ``"lmeval"`` with ``harness_config`` launches a harness-bridge run (§4).

        Unknown keyword arguments are sent as-is, so the API names them in its 422, except the retired
        ``operator`` and ``agent`` (§8): they raise TypeError naming ``driver=`` before anything is sent.
        """
        for key, replacement in RETIRED_LAUNCH_KEYS.items():
            if key in extra:
                raise TypeError(f"launch() got '{key}=', which was renamed '{replacement}=' (see docs/concepts.md §8)")
        body: dict[str, Any] = {"model": model, **extra}
        if dataset is not None:  # a pinned launch names benchmark=, subset= (and impl=) instead
            body["dataset"] = dataset
        for key, value in (("driver", driver), ("task_impl", task_impl), ("trials", trials),
                           ("metadata", metadata), ("visibility", visibility), ("concurrency", concurrency),
                           ("limits", limits), ("constraints", constraints), ("compute", compute),
                           ("requirements", requirements), ("harness", harness),
                           ("harness_config", harness_config)):
            if value is not None:
                body[key] = value
        return self._call("POST", "/v1/runs", json=body)  # type: ignore[no-any-return]

    def run(self, run_id: str, *, wait_s: float | None = None) -> dict[str, Any]:
        """One run; with ``wait_s`` the API holds the answer until the run settles or that many seconds pass."""
        run_id = self._rid(run_id)
        params = {"wait_s": round(wait_s, 3)} if wait_s else None
        return self._call("GET", f"/v1/runs/{run_id}", params=params)  # type: ignore[no-any-return]

    def runs(self, *, limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return self._call("GET", "/v1/runs", params=params)  # type: ignore[no-any-return]

    def iter_runs(self, *, page: int = 200) -> Iterator[dict[str, Any]]:
        """Every run of the account as summaries, newest first, following ``next_cursor``."""
        cursor: str | None = None
        while True:
            body = self.runs(limit=page, cursor=cursor)
            yield from body["runs"]
            cursor = body["next_cursor"]
            if not cursor:
                return

    def events(self, run_id: str, *, after: int = -1, limit: int = 1000) -> dict[str, Any]:
        run_id = self._rid(run_id)
        return self._call("GET", f"/v1/runs/{run_id}/events", params={"after": after, "limit": limit})  # type: ignore[no-any-return]

    def stream_events(self, run_id: str, *, after: int = -1,
                      reconnects: int = SSE_RECONNECTS) -> Iterator[dict[str, Any]]:
        """Live events over SSE (from the one after seq ``after``) until the run's terminal event.

        A dropped connection (the API restarted, a proxy cut the stream) is resumed with ``Last-Event-ID`` set to
        the last seq received, so no event is lost or repeated. A stream that closes cleanly before the terminal
        event is resumed too, unless the run is over (its terminal event precedes ``after``).
        """
        run_id = self._rid(run_id)
        return self._stream(f"/v1/runs/{run_id}/events", f"run {run_id}", TERMINAL_EVENT,
                            lambda: bool(self.run(run_id).get("terminal")), after=after, reconnects=reconnects)

    def session(self, session_id: str) -> dict[str, Any]:
        """An Operator session: status, answer, the runs it launched, cost."""
        return self._call("GET", f"/v1/operator/sessions/{quote(session_id, safe='')}")  # type: ignore[no-any-return]

    def stream_session_events(self, session_id: str, *, after: int = -1,
                              reconnects: int = SSE_RECONNECTS) -> Iterator[dict[str, Any]]:
        """An Operator session's log live over SSE until SessionAnswered, resumed as ``stream_events`` is."""
        path = f"/v1/operator/sessions/{quote(session_id, safe='')}/events"
        return self._stream(path, f"operator session {session_id}", "SessionAnswered",
                            lambda: self.session(session_id)["status"] in ("answered", "stopped", "failed"),
                            after=after, reconnects=reconnects)

    def _stream(self, path: str, what: str, terminal: str, over: Callable[[], bool], *, after: int,
                reconnects: int) -> Iterator[dict[str, Any]]:
        last, failures = after, 0
        while True:
            try:
                for event in self._sse_once(path, last):
                    last, failures = int(event["seq"]), 0
                    yield event
                    if event["type"] == terminal:
                        return
                if over():
                    return
            except httpx.TransportError as exc:
                if failures >= reconnects:
                    raise ApiError(0, "unreachable", f"the event stream of {what} dropped {failures + 1} "
                                                     f"times in a row (last seq {last}): {exc}") from exc
            failures += 1
            time.sleep(min(5.0, 0.25 * 2 ** (failures - 1)))

    def _sse_once(self, path: str, after: int) -> Iterator[dict[str, Any]]:
        """One SSE connection: the events it delivers until the server closes it."""
        headers = {"Accept": "text/event-stream", "Last-Event-ID": str(after)}
        with self._http.stream("GET", path, headers=headers, timeout=httpx.Timeout(
                self._http.timeout.connect, read=None)) as resp:
            if resp.status_code >= 400:
                resp.read()
                _raise_for(resp)
            data: list[str] = []
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and data:
                    yield json.loads("\n".join(data))
                    data = []

    def tasks(self, run_id: str, *, after: int = -1, limit: int = 500) -> dict[str, Any]:
        run_id = self._rid(run_id)
        return self._call("GET", f"/v1/runs/{run_id}/tasks", params={"after": after, "limit": limit})  # type: ignore[no-any-return]

    def iter_tasks(self, run_id: str, *, page: int = 500) -> Iterator[dict[str, Any]]:
        """Every settled task row of the run, by index, following ``next_after``."""
        run_id = self._rid(run_id)
        after = -1
        while True:
            body = self.tasks(run_id, after=after, limit=page)
            yield from body["tasks"]
            if body["next_after"] is None or not body["tasks"]:
                return
            after = body["next_after"]

    def breakdown(self, run_id: str, *, by: str | None = None) -> dict[str, Any]:
        """Pass rate, counts and 95 % interval per value of dataset column ``by`` (default: the run's grouping
        column); an unknown column raises ApiError 400 naming the columns there are."""
        params = {"by": by} if by is not None else {}
        return self._call("GET", f"/v1/runs/{run_id}/breakdown", params=params)  # type: ignore[no-any-return]

    def files(self, run_id: str) -> dict[str, Any]:
        """The files the run's report wrote (``report.html``, ``results.json``): name, media type, digest, size."""
        return self._call("GET", f"/v1/runs/{run_id}/files")  # type: ignore[no-any-return]

    def file(self, run_id: str, name: str) -> bytes:
        """The bytes of one of the run's report files (raises ApiError 404 when the run has no such file)."""
        try:
            resp = self._http.get(f"/v1/runs/{run_id}/files/{name}")
        except httpx.TransportError as exc:
            raise ApiError(0, "unreachable", f"cannot reach the API at {self._http.base_url}: {exc}") from exc
        _raise_for(resp)
        return resp.content

    def task(self, run_id: str, index: int) -> dict[str, Any]:
        run_id = self._rid(run_id)
        return self._call("GET", f"/v1/runs/{run_id}/tasks/{index}")  # type: ignore[no-any-return]

    def fork(self, run_id: str, *, rewind_to: str | None = None, instructions: str | None = None,
             **overrides: Any) -> dict[str, Any]:
        """Fork a run (§10): a new run inheriting the phases before ``rewind_to``, with ``overrides`` (model,
        dataset, requirements, task_impl, scorer_instructions, trials, limits, concurrency) and/or prose
        ``instructions`` for the Fork phase's Driver."""
        run_id = self._rid(run_id)
        body: dict[str, Any] = {"overrides": overrides}
        if rewind_to is not None:
            body["rewind_to"] = rewind_to
        if instructions is not None:
            body["instructions"] = instructions
        return self._call("POST", f"/v1/runs/{run_id}/fork", json=body)  # type: ignore[no-any-return]

    def replay(self, run_id: str, *, model: str | dict[str, Any]) -> dict[str, Any]:
        """Replay a run against ``model``: benchmark, sample, impl and trials pinned to the reference."""
        run_id = self._rid(run_id)
        return self._call("POST", f"/v1/runs/{run_id}/replay", json={"model": model})  # type: ignore[no-any-return]

    def sweep(self, run_id: str, *, models: list[str | dict[str, Any]]) -> dict[str, Any]:
        """One replay of the run per model, all at once: ``{"reference", "runs": [...]}``."""
        run_id = self._rid(run_id)
        return self._call("POST", f"/v1/runs/{run_id}/sweep", json={"models": models})  # type: ignore[no-any-return]

    def lineage(self, run_id: str) -> dict[str, Any]:
        """The fork tree the run belongs to (root first, parents before children)."""
        run_id = self._rid(run_id)
        return self._call("GET", f"/v1/runs/{run_id}/lineage")  # type: ignore[no-any-return]

    def stop(self, run_id: str, *, reason: str | None = None) -> dict[str, Any]:
        """Halt the run for good (operator_kill)."""
        run_id = self._rid(run_id)
        return self._call("POST", f"/v1/runs/{run_id}/stop", json={"reason": reason} if reason else None)  # type: ignore[no-any-return]

    def admin_halt(self, run_id: str, *, reason: str) -> dict[str, Any]:
        """Halt any account's run as a platform administrator (``admin: <reason>``, display_status ``killed``).
        A non-admin key gets 404: for it the route does not exist. Takes the full id (a prefix resolves over the
        caller's own runs only, and an admin halts other accounts' runs)."""
        return self._call("POST", f"/v1/admin/runs/{quote(run_id, safe='')}/halt", json={"reason": reason})  # type: ignore[no-any-return]

    def admin_audit(self, *, limit: int = 50, cursor: str | None = None,
                    action: str | None = None) -> dict[str, Any]:
        """One page of the audit trail, newest first (admins only; a non-admin key gets 404)."""
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        if action is not None:
            params["action"] = action
        return self._call("GET", "/v1/admin/audit", params=params)  # type: ignore[no-any-return]

    def pause(self, run_id: str) -> dict[str, Any]:
        run_id = self._rid(run_id)
        return self._call("POST", f"/v1/runs/{run_id}/pause")  # type: ignore[no-any-return]

    def resume(self, run_id: str) -> dict[str, Any]:
        """Resume a paused run; raises ApiError(409, "not_paused") for any other halt."""
        run_id = self._rid(run_id)
        return self._call("POST", f"/v1/runs/{run_id}/resume")  # type: ignore[no-any-return]

    def resolve_review(self, run_id: str, *, resolution: str) -> dict[str, Any]:
        run_id = self._rid(run_id)
        return self._call("PATCH", f"/v1/runs/{run_id}", json={"review_resolution": resolution})  # type: ignore[no-any-return]

    # -- provider secrets (write-only: the API never returns a value)

    def set_secret(self, name: str, value: str, *, host_pattern: str | None = None) -> dict[str, Any]:
        """Store (or replace) a provider secret; answers its name, host pattern and creation time."""
        body: dict[str, Any] = {"name": name, "value": value}
        if host_pattern is not None:
            body["host_pattern"] = host_pattern
        return self._call("POST", "/v1/secrets", json=body)  # type: ignore[no-any-return]

    def secrets(self) -> list[dict[str, Any]]:
        """The account's secrets: name, host_pattern, created_at (never a value)."""
        return self._call("GET", "/v1/secrets")["secrets"]  # type: ignore[no-any-return]

    def delete_secret(self, name: str) -> None:
        """Delete a secret. A name no secret can have (``POST /v1/secrets``'s pattern) raises ValueError before any
        call, so no name can steer the request's path."""
        if not SECRET_NAME.fullmatch(name):
            raise ValueError(f"{name[:40]!r} is not a secret name (letters, digits and _; not starting with a digit)")
        try:
            resp = self._http.request("DELETE", f"/v1/secrets/{name}")
        except httpx.TransportError as exc:
            raise ApiError(0, "unreachable", f"cannot reach the API at {self._http.base_url}: {exc}") from exc
        _raise_for(resp)

    def account(self) -> dict[str, Any]:
        return self._call("GET", "/v1/account")  # type: ignore[no-any-return]

    # -- answers (issue 17): comparisons, frontier, scheduled regression runs

    def compare(self, a: str, b: str) -> dict[str, Any]:
        """B against A task by task: flips, paired interval, McNemar's exact p, a verdict in words."""
        a, b = self.resolve_run_id(a), self.resolve_run_id(b)
        return self._call("GET", "/v1/compare", params={"a": a, "b": b})  # type: ignore[no-any-return]

    def rank(self, runs: list[str]) -> dict[str, Any]:
        """Runs of one shape ranked by pass rate, with intervals and each run's p against the leader."""
        runs = [self.resolve_run_id(r) for r in runs]
        return self._call("GET", "/v1/compare", params={"runs": ",".join(runs)})  # type: ignore[no-any-return]

    def frontier(self, runs: list[str]) -> dict[str, Any]:
        """Pass rate against cost per task, Pareto-optimal runs marked."""
        runs = [self.resolve_run_id(r) for r in runs]
        return self._call("GET", "/v1/frontier", params={"runs": ",".join(runs)})  # type: ignore[no-any-return]

    def create_schedule(self, *, replay_of: str, every: str, drop: float | None = None, p: float | None = None,
                        webhook: str | None = None) -> dict[str, Any]:
        alert = {k: v for k, v in (("drop", drop), ("p", p)) if v is not None}
        replay_of = self.resolve_run_id(replay_of)
        body: dict[str, Any] = {"replay_of": replay_of, "every": every, "alert": alert}
        if webhook is not None:
            body["webhook"] = webhook
        return self._call("POST", "/v1/schedules", json=body)  # type: ignore[no-any-return]

    def schedules(self) -> dict[str, Any]:
        return self._call("GET", "/v1/schedules")  # type: ignore[no-any-return]

    def schedule(self, schedule_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/schedules/{schedule_id}")  # type: ignore[no-any-return]

    def pause_schedule(self, schedule_id: str, *, paused: bool = True) -> dict[str, Any]:
        return self._call("PATCH", f"/v1/schedules/{schedule_id}", json={"paused": paused})  # type: ignore[no-any-return]

    def delete_schedule(self, schedule_id: str) -> None:
        try:
            resp = self._http.request("DELETE", f"/v1/schedules/{schedule_id}")
        except httpx.TransportError as exc:
            raise ApiError(0, "unreachable", f"cannot reach the API at {self._http.base_url}: {exc}") from exc
        _raise_for(resp)

    def wait(self, run_id: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Return the run once it leaves ``running`` or halts (paused or waiting included).

        Long-polls the API (``GET /v1/runs/{id}?wait_s=``), which answers the moment the run's row turns (its workflow's
        last activity before the report wrote it); the report files follow (``files``).
        """
        run_id = self._rid(run_id)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        hold = max(1.0, min(WAIT_HOLD_S, self._http.timeout.read - 5 if self._http.timeout.read else WAIT_HOLD_S))
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            hold_s = hold if left is None else max(0.0, min(hold, left))
            run: dict[str, Any] = self._call("GET", f"/v1/runs/{run_id}", params={"wait_s": round(hold_s, 3)})
            if run["status"] != "running" or run["halted"]:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} still running after {timeout_s} s")
