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
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

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
        raise FileNotFoundError(f"{path} not found: start the stack with 'benchwright up' (or pass --api-url/--api-key)")
    return json.loads(path.read_text())  # type: ignore[no-any-return]


WAIT_HOLD_S = 20.0
"""Longest single long poll of ``Client.wait`` (kept below the HTTP timeout)."""


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

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            resp = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiError(0, "unreachable", f"cannot reach the API at {self._http.base_url}: {exc}") from exc
        if resp.status_code >= 400:
            try:
                err = resp.json()["error"]
                raise ApiError(resp.status_code, err.get("code", "error"), err.get("message", resp.text))
            except (ValueError, KeyError, TypeError):
                raise ApiError(resp.status_code, "http_error", resp.text) from None
        return resp.json()

    def launch(self, *, dataset: str, model: str | dict[str, Any], driver: str | None = None,
               task_impl: str | None = None, trials: dict[str, Any] | None = None,
               metadata: dict[str, Any] | None = None, visibility: str | None = None,
               **extra: Any) -> dict[str, Any]:
        """Launch a run (``POST /v1/runs``). Unknown keyword arguments are sent as-is, so the API names them."""
        body: dict[str, Any] = {"dataset": dataset, "model": model, **extra}
        for key, value in (("driver", driver), ("task_impl", task_impl), ("trials", trials),
                           ("metadata", metadata), ("visibility", visibility)):
            if value is not None:
                body[key] = value
        return self._call("POST", "/v1/runs", json=body)  # type: ignore[no-any-return]

    def run(self, run_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/runs/{run_id}")  # type: ignore[no-any-return]

    def runs(self, *, limit: int = 50, cursor: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": limit}
        if cursor:
            params["cursor"] = cursor
        return self._call("GET", "/v1/runs", params=params)  # type: ignore[no-any-return]

    def events(self, run_id: str, *, after: int = -1, limit: int = 1000) -> dict[str, Any]:
        return self._call("GET", f"/v1/runs/{run_id}/events", params={"after": after, "limit": limit})  # type: ignore[no-any-return]

    def stream_events(self, run_id: str, *, after: int = -1) -> Iterator[dict[str, Any]]:
        """Live events over SSE until the run's terminal event."""
        headers = {"Accept": "text/event-stream", "Last-Event-ID": str(after)}
        with self._http.stream("GET", f"/v1/runs/{run_id}/events", headers=headers, timeout=None) as resp:
            if resp.status_code >= 400:
                resp.read()
                self._call("GET", f"/v1/runs/{run_id}")  # raises the API's error
            data: list[str] = []
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and data:
                    yield json.loads("\n".join(data))
                    data = []

    def tasks(self, run_id: str, *, after: int = -1, limit: int = 500) -> dict[str, Any]:
        return self._call("GET", f"/v1/runs/{run_id}/tasks", params={"after": after, "limit": limit})  # type: ignore[no-any-return]

    def task(self, run_id: str, index: int) -> dict[str, Any]:
        return self._call("GET", f"/v1/runs/{run_id}/tasks/{index}")  # type: ignore[no-any-return]

    def stop(self, run_id: str, *, reason: str | None = None) -> dict[str, Any]:
        """Halt the run for good (operator_kill)."""
        return self._call("POST", f"/v1/runs/{run_id}/stop", json={"reason": reason} if reason else None)  # type: ignore[no-any-return]

    def pause(self, run_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/runs/{run_id}/pause")  # type: ignore[no-any-return]

    def resume(self, run_id: str) -> dict[str, Any]:
        """Resume a paused run; raises ApiError(409, "not_paused") for any other halt."""
        return self._call("POST", f"/v1/runs/{run_id}/resume")  # type: ignore[no-any-return]

    def resolve_review(self, run_id: str, *, resolution: str) -> dict[str, Any]:
        return self._call("PATCH", f"/v1/runs/{run_id}", json={"review_resolution": resolution})  # type: ignore[no-any-return]

    def account(self) -> dict[str, Any]:
        return self._call("GET", "/v1/account")  # type: ignore[no-any-return]

    def wait(self, run_id: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Return the run once it leaves ``running`` or halts (paused or waiting included).

        Long-polls the API (``GET /v1/runs/{id}?wait_s=``), which answers the moment the run's workflow completes.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        hold = max(1.0, min(WAIT_HOLD_S, self._http.timeout.read - 5 if self._http.timeout.read else WAIT_HOLD_S))
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            run = self._call("GET", f"/v1/runs/{run_id}",
                             params={"wait_s": round(hold if left is None else max(0.0, min(hold, left)), 3)})
            if run["status"] != "running" or run["halted"]:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} still running after {timeout_s} s")
