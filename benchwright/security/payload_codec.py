"""Temporal payload encryption: launch bodies, scorer code, prompts and task outputs never rest in Temporal's history
(or its database) in clear.

Temporal's documented pattern: a ``PayloadCodec`` that replaces each payload by one whose ``data`` is the AES-GCM
encryption of the whole serialized payload, with ``encoding: binary/encrypted`` and the key's id in its metadata,
composed with the pydantic data converter on every client and worker (``data_converter``). Failures' messages and
stack traces are moved into an encoded payload too (``DefaultFailureConverterWithEncodedAttributes``), so an error
quoting a task's output is encrypted like the output. Every payload is encrypted, public runs' too: the codec cannot
tell whose a payload is, and a history readable only by holders of the key costs nothing to the public.

Decoding passes payloads without ``binary/encrypted`` through unchanged: histories recorded before encryption (and
the replay histories in tests/replay) still decode and replay.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter, DefaultFailureConverterWithEncodedAttributes, PayloadCodec

from benchwright.errors import InvalidInput
from benchwright.security.crypto import KEY_ENV, KEY_FILE_ENV, Keyring, ensure_key_file, load_keyring

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
AAD = b"benchwright-temporal-payload"
MAX_CODEC_PAYLOADS = 10_000
UI_TOKEN_LABEL = b"benchwright-temporal-ui-codec"


class EncryptionCodec(PayloadCodec):
    """AES-GCM under the deployment keyring's primary key; decodes under any key the keyring holds."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encode_one(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decode_one(p) for p in payloads]

    def encode_one(self, payload: Payload) -> Payload:
        kid, blob = self.keyring.encrypt(payload.SerializeToString(), aad=AAD)
        return Payload(metadata={"encoding": ENCODING, KEY_ID: kid.encode()}, data=blob)

    def decode_one(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload  # recorded without encryption: as it is
        kid = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
        return Payload.FromString(self.keyring.decrypt(kid, payload.data, aad=AAD))


def data_converter(keyring: Keyring | None) -> DataConverter:
    """The pydantic data converter, with the encryption codec when the deployment has a key."""
    if keyring is None:
        return pydantic_data_converter
    return dataclasses.replace(pydantic_data_converter, payload_codec=EncryptionCodec(keyring),
                               failure_converter_class=DefaultFailureConverterWithEncodedAttributes)


def codec_json(codec: EncryptionCodec, body: Any, *, op: str) -> dict[str, Any]:
    """The codec server protocol (what the Temporal UI and ``temporal --codec-endpoint`` send): ``{"payloads":
    [<Payload as proto JSON>]}`` in, the same shape out, each payload encoded or decoded.

    Raises:
        InvalidInput: the body is not that shape.
    """
    if not isinstance(body, dict) or not isinstance(body.get("payloads"), list):
        raise InvalidInput('a codec request is {"payloads": [...]}', code="invalid_codec_request")
    if len(body["payloads"]) > MAX_CODEC_PAYLOADS:
        raise InvalidInput(f"at most {MAX_CODEC_PAYLOADS} payloads per request", code="invalid_codec_request")
    try:
        payloads = json_format.ParseDict({"payloads": body["payloads"]}, Payloads())
    except json_format.ParseError as exc:
        raise InvalidInput(f"not a list of Temporal payloads: {exc}", code="invalid_codec_request") from None
    step = codec.encode_one if op == "encode" else codec.decode_one
    out = Payloads(payloads=[step(p) for p in payloads.payloads])
    return json_format.MessageToDict(out)


def ui_token(keyring: Keyring, kid: str | None = None) -> str:
    """The path token of the Temporal UI's codec endpoint: an HMAC under a deployment key (the primary by default),
    so it names the key's holder without revealing the key (``api/routes/codec.py``)."""
    return keyring.derive(kid or keyring.primary_id, UI_TOKEN_LABEL)


def embedded_stack_codec(data_dir: Path, api_url: str) -> list[str]:
    """For ``benchwright up``: make the deployment key on first start (``<data_dir>/deployment.key``, 0600) unless
    the environment names one, and return the dev server flags that point its UI at the API's codec endpoint."""
    from benchwright.settings import Settings

    if not (os.environ.get(KEY_ENV) or os.environ.get(KEY_FILE_ENV)):
        ensure_key_file(data_dir)
    keyring = load_keyring(Settings(data_dir=data_dir))
    if keyring is None:
        return []
    return ["--ui-codec-endpoint", f"{api_url}/v1/admin/codec/ui/{ui_token(keyring)}"]
