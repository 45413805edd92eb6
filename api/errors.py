"""The one place that maps errors to HTTP answers: ``{"error": {"code", "message"}}``.

It also declares them: ``responses(...)`` builds the OpenAPI ``responses=`` of a route from the same table, so
every status a route can answer is documented with the one error schema (``ErrorBody``).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from benchwright.errors import (
    BenchwrightError,
    Conflict,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    PaymentRequired,
    QuotaExceeded,
    Unauthorized,
    Unavailable,
)

STATUS: dict[type[BenchwrightError], int] = {
    InvalidInput: 400,
    Unauthorized: 401,
    PaymentRequired: 402,
    NotFound: 404,
    Conflict: 409,
    PayloadTooLarge: 413,
    QuotaExceeded: 429,
    Unavailable: 503,
}


class ErrorDetail(BaseModel):
    code: str
    """Machine-readable, e.g. ``not_found``, ``already_finished``, ``payload_too_large``, ``validation_error``."""
    message: str
    """For the person reading it: names the problem and, where there is one, the fix."""
    details: list[dict[str, Any]] | None = None
    """422 only: one entry per invalid field (``loc``, ``type``, ``msg``)."""


class ErrorBody(BaseModel):
    """Every error answer of the API."""

    error: ErrorDetail


_DESCRIPTIONS = {
    400: "A value is present but not acceptable (unknown driver, unenforceable limit, unconfigured backend, a body "
         "that is not UTF-8, ...)",
    401: "Missing or wrong API key (`Authorization: Bearer <key>`; the scheme is case-insensitive)",
    402: "The account's balance is exhausted",
    404: "No such resource for this caller",
    409: "The resource's state refuses the call (e.g. `already_finished`, `not_paused`, `already_halted`)",
    413: "The request body is larger than the deployment's limit (`payload_too_large`)",
    422: "The request does not match the schema (`validation_error`, one detail per field)",
    429: "The account is at one of its quotas (`quota_exceeded`: the message names the quota, the use and the "
         "limit); `Retry-After` says when to try again",
    503: "A service Benchwright needs (Temporal, a worker) is not answering",
}
AUTHED = (401, 422)
"""What every authenticated route can answer: a bad or missing key, a request that does not match the schema."""


BODY = (400, 413)
"""What a route with a request body can answer besides AUTHED: a body that is not UTF-8/JSON at all (400), or one
over the size limit (413)."""


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route: the given statuses (plus AUTHED) with the shared error schema."""
    return {status: {"model": ErrorBody, "description": _DESCRIPTIONS[status]}
            for status in sorted({*AUTHED, *statuses})}


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def _status_for(exc: BenchwrightError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


async def _app_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, BenchwrightError)
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, Unauthorized) else None
    if isinstance(exc, QuotaExceeded):
        headers = {"Retry-After": str(exc.retry_after_s)}
    return JSONResponse(error_body(exc.code, exc.message), status_code=_status_for(exc), headers=headers)


def _describe(err: dict[str, Any]) -> str:
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    where = ".".join(loc)
    if err.get("type") == "extra_forbidden":
        return f"unknown key '{where}'"
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    message = "; ".join(_describe(e) for e in errors) or "invalid request"
    details = [{"loc": [str(p) for p in e.get("loc", ())], "type": e.get("type"), "msg": e.get("msg")} for e in errors]
    return JSONResponse(error_body("validation_error", message, details=details), status_code=422)


ADMIN_PREFIX = "/v1/admin/"


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at the request's path (Starlette's own 405 names only the first route's)."""
    routes = request.app.router.routes
    return [method for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
            if any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes)]


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(exc.status_code, "http_error")
    headers = dict(exc.headers or {})
    if exc.status_code == 405 and request.url.path.startswith(ADMIN_PREFIX):
        # The admin surface does not exist for anyone who is not an admin: a wrong method there must not reveal it
        # with a 405 naming the methods it serves (api/routes/admin.py); it answers what an unknown path answers.
        return JSONResponse(error_body("not_found", "Not Found"), status_code=404)
    if exc.status_code == 405:  # RFC 9110 §15.5.6: a 405 carries Allow, listing what the path serves
        headers["Allow"] = ", ".join(allowed_methods(request)) or headers.get("Allow", "")
    return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code, headers=headers or None)


async def _already_started(_: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(error_body("already_started", str(exc)), status_code=409)


async def _temporal_unavailable(_: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(error_body("temporal_unavailable", f"the workflow service did not answer: {exc}"),
                        status_code=503)


def install(app: FastAPI) -> None:
    app.add_exception_handler(BenchwrightError, _app_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(WorkflowAlreadyStartedError, _already_started)
    app.add_exception_handler(RPCError, _temporal_unavailable)
    install_store_errors(app)


async def _store_error(_: Request, exc: Exception) -> JSONResponse:
    """A store that is out for a while (Postgres restarting, a full disk) answers 503, in plain words; any other
    database error stays a 500."""
    from benchwright.store.db import store_outage

    outage = store_outage(exc)
    if outage is None:
        raise exc
    return JSONResponse(error_body("store_unavailable", f"{outage}; try again shortly"), status_code=503,
                        headers={"Retry-After": "5"})


def install_store_errors(app: FastAPI) -> None:
    from sqlalchemy.exc import DBAPIError

    app.add_exception_handler(DBAPIError, _store_error)
