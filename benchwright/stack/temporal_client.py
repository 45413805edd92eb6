"""Connecting to Temporal with the data converter every side of Benchwright uses: pydantic models as payloads,
encrypted with the deployment key when there is one (``benchwright.security.payload_codec``)."""

from __future__ import annotations

from temporalio.client import Client

from benchwright.security.crypto import load_keyring
from benchwright.security.payload_codec import data_converter
from benchwright.settings import Settings


async def connect(settings: Settings) -> Client:
    return await Client.connect(settings.temporal_address, namespace=settings.temporal_namespace,
                                data_converter=data_converter(load_keyring(settings)))
