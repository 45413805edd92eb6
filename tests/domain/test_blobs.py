"""The blob store against real backends: a directory, and boto3 against moto's S3 server (a real S3 protocol
server started on a free port for this module)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchwright.data.blobs import (
    BlobError,
    BlobNotFound,
    BlobStore,
    DirBlobStore,
    S3BlobStore,
    blob_id,
    open_blob_store,
)
from benchwright.testkit.moto_s3 import MotoS3, moto_s3_in_env


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    with moto_s3_in_env() as server:
        yield server


@pytest.fixture(params=["dir", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "dir":
        return DirBlobStore(tmp_path / "blobs")
    server: MotoS3 = request.getfixturevalue("moto")
    return S3BlobStore(bucket=f"bw-{tmp_path.name.lower().replace('_', '-')[:40]}", prefix="runs",
                       endpoint_url=server.endpoint_url)


async def test_put_get_roundtrip_is_content_addressed(store: BlobStore) -> None:
    data = os.urandom(300_000) + b"\x00tail"
    digest = await store.put(data)
    assert digest == blob_id(data)
    assert await store.put(data) == digest  # idempotent
    assert await store.exists(digest)
    assert await store.get(digest) == data
    assert await store.get(await store.put(b"")) == b""


async def test_unknown_and_malformed_ids_are_not_found(store: BlobStore) -> None:
    with pytest.raises(BlobNotFound):
        await store.get("0" * 64)
    with pytest.raises(BlobNotFound):
        await store.get("../../etc/passwd")
    assert not await store.exists("0" * 64)


async def test_a_second_client_on_the_same_store_reads_the_blob(store: BlobStore) -> None:
    digest = await store.put(b"handed from one worker to another")
    if isinstance(store, S3BlobStore):
        other: BlobStore = open_blob_store(store.url, endpoint_url=store._client.meta.endpoint_url)
    else:
        other = open_blob_store(store.url)
    assert await other.get(digest) == b"handed from one worker to another"


async def test_damaged_blob_is_refused(tmp_path: Path) -> None:
    store = DirBlobStore(tmp_path)
    digest = await store.put(b"original")
    (tmp_path / digest[:2] / digest[2:]).write_bytes(b"tampered")
    with pytest.raises(BlobError, match="damaged"):
        await store.get(digest)


def test_open_blob_store_rejects_unknown_schemes() -> None:
    with pytest.raises(ValueError, match="file:// or s3://"):
        open_blob_store("ftp://somewhere/x")
    with pytest.raises(ValueError, match="names no bucket"):
        open_blob_store("s3:///prefix")
