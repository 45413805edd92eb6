"""A request-body size limit, as pure ASGI middleware.

It refuses a body over ``max_bytes`` with 413 ``payload_too_large`` before the app parses it: a declared
``Content-Length`` over the limit is answered without reading a byte; otherwise the bytes are counted as they
stream in, so a chunked body (no ``Content-Length``) is bounded too. Without it a 50 MB ``metadata`` launch was
parsed, stored and then served back by every list call (issue 15 item 2).
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once the streamed body passes the limit.

    An ``HTTPException`` on purpose: FastAPI turns any other exception raised while reading the body into a 400
    "error parsing the body"; this one reaches ``api/errors.py``, which answers 413 ``payload_too_large``.
    """

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the request body is larger than this deployment's limit of {max_bytes} bytes "
                              "(BENCHWRIGHT_MAX_BODY_BYTES)")


class BodyLimit:
    """Bound every HTTP request body to ``max_bytes``."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await _refuse(BodyTooLarge(self.max_bytes), scope, receive, send)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge as exc:  # read outside the routes' exception handlers (a middleware, say)
            if started:
                raise
            await _refuse(exc, scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server (uvicorn/h11) refuses a malformed length before we see it
    return None


async def _refuse(exc: BodyTooLarge, scope: Scope, receive: Receive, send: Send) -> None:
    body = {"error": {"code": "payload_too_large", "message": exc.detail}}
    # The unread body is the server's to discard; closing the connection keeps a client from streaming the rest.
    await JSONResponse(body, status_code=413, headers={"Connection": "close"})(scope, receive, send)
