"""The Temporal codec server (``POST …/encode`` and ``…/decode`` with ``{"payloads": [...]}``): operators who hold the
deployment key's authority read decrypted payloads in the Temporal UI or with ``temporal --codec-endpoint``.

``/v1/admin/codec/{encode,decode}`` answers admin accounts only (``Authorization: Bearer <admin key>``; the CLI's
``--codec-auth``); everyone else gets the 404 of every admin route. The Temporal UI cannot send our API key, so the
embedded stack (``benchwright up``, ``temporal_ui_codec`` on) also serves ``/v1/admin/codec/ui/<token>/…``, the token
an HMAC of the deployment key that ``up`` hands the dev server's UI (``--ui-codec-endpoint``): on one machine the
UI is the operator's. A deployment that does not set ``temporal_ui_codec`` answers that path 404.

CORS: the Temporal UI's origin (``temporal_ui_url``) may call these paths from the browser, and nothing else is
opened to it.
"""

from __future__ import annotations

import hmac
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Path
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from api.deps import StateDep
from api.routes.admin import AdminDep
from benchwright.security.crypto import DeploymentKeyError, keyring_of
from benchwright.security.payload_codec import EncryptionCodec, codec_json, ui_token

PREFIX = "/v1/admin/codec"
router = APIRouter(prefix=PREFIX, tags=["admin"], include_in_schema=False)
Op = Literal["encode", "decode"]


def _codec(state: Any) -> EncryptionCodec:
    keyring = keyring_of(state.engine)
    if keyring is None:
        raise DeploymentKeyError("this deployment has no deployment key: its Temporal payloads are not encrypted",
                                 code="no_deployment_key")
    return EncryptionCodec(keyring)


@router.post("/{op}")
async def codec(op: Op, admin: AdminDep, state: StateDep,
                body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
    """Encode or decode Temporal payloads (admin accounts only)."""
    return codec_json(_codec(state), body, op=op)


@router.post("/ui/{token}/{op}")
async def codec_for_ui(token: Annotated[str, Path(max_length=64)], op: Op, state: StateDep,
                       body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
    """The same, for the embedded stack's Temporal UI, authorised by the path token ``up`` configured."""
    keyring = keyring_of(state.engine)
    if not state.settings.temporal_ui_codec or keyring is None or not any(
            hmac.compare_digest(token, ui_token(keyring, kid)) for kid in keyring.ids):
        raise HTTPException(status_code=404, detail="Not Found")
    return codec_json(EncryptionCodec(keyring), body, op=op)


class CodecCors:
    """CORS for the codec paths only, from the Temporal UI's origin only."""

    def __init__(self, app: ASGIApp, *, ui_origin: str | None) -> None:
        self.app = app
        self.cors = CORSMiddleware(app, allow_origins=[ui_origin.rstrip("/")] if ui_origin else [],
                                   allow_methods=["POST"], allow_credentials=True,
                                   allow_headers=["authorization", "content-type", "x-namespace"])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope.get("path", "")).startswith(PREFIX + "/"):
            await self.cors(scope, receive, send)
        else:
            await self.app(scope, receive, send)
