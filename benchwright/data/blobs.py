"""Content-addressed blob store: what one phase hands the next (datasets, tasks, scorer files, snapshots).

A blob's id is the sha256 of its bytes (64 hex digits), so a blob is written once whoever writes it, any worker on
any host reads the same bytes for the same id, and a reader can check what it got. Two implementations:

* :class:`DirBlobStore` — a directory (``<root>/ab/cdef…``), the embedded stack's default under the data dir;
  shared by workers only if they share that directory.
* :class:`S3BlobStore` — any S3-compatible object store (AWS S3, MinIO, Ceph, R2...) through ``boto3``; the
  production store, shared by workers on any host. Tested against moto's S3 server (``tests/domain/test_blobs.py``).

Which one a deployment uses is one setting, ``blob_store_url`` (``file:///path`` or ``s3://bucket/prefix``);
:func:`open_blob_store` turns it into a store.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class BlobError(Exception):
    """A blob could not be stored or read (the store failed, or returned bytes that do not match their id)."""


class BlobNotFound(BlobError, KeyError):
    """No blob has that id in this store."""


def blob_id(data: bytes) -> str:
    """The id of ``data`` in every store: its sha256, hex."""
    return hashlib.sha256(data).hexdigest()


def _check_id(digest: str) -> str:
    if not _DIGEST.match(digest):
        raise BlobNotFound(f"{digest!r} is not a blob id (64 lowercase hex digits)")
    return digest


def _verified(digest: str, data: bytes) -> bytes:
    if blob_id(data) != digest:
        raise BlobError(f"blob {digest} is damaged: its bytes hash to {blob_id(data)}")
    return data


@runtime_checkable
class BlobStore(Protocol):
    """Put bytes, get them back by their sha256 from any process that opens the same store."""

    url: str
    """Where the store is (``file:///...`` or ``s3://bucket/prefix``), for messages and for other processes."""

    async def put(self, data: bytes) -> str:
        """Store ``data`` (a no-op when it is there already); returns its id."""
        ...

    async def get(self, digest: str) -> bytes:
        """The bytes of blob ``digest``, checked against it.

        Raises:
            BlobNotFound: no such blob.
            BlobError: the store failed, or the bytes do not hash to ``digest``.
        """
        ...

    async def exists(self, digest: str) -> bool:
        """Whether blob ``digest`` is in the store."""
        ...

    def put_sync(self, data: bytes) -> str:
        """``put`` for code already off the event loop (a worker thread: the registry's blob store)."""
        ...

    def get_sync(self, digest: str) -> bytes:
        """``get`` for code already off the event loop; raises as ``get`` does."""
        ...

    def exists_sync(self, digest: str) -> bool:
        """``exists`` for code already off the event loop."""
        ...


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file and a rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class DirBlobStore:
    """Blobs as files under ``root`` (``ab/cdef…``), written atomically (temp file + rename)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.resolve().as_uri()

    def _path(self, digest: str) -> Path:
        return self.root / digest[:2] / digest[2:]

    def put_sync(self, data: bytes) -> str:
        digest = blob_id(data)
        path = self._path(digest)
        if path.exists():
            return digest
        write_atomic(path, data)
        return digest

    def get_sync(self, digest: str) -> bytes:
        try:
            data = self._path(_check_id(digest)).read_bytes()
        except FileNotFoundError:
            raise BlobNotFound(f"no blob {digest} in {self.url}") from None
        return _verified(digest, data)

    def exists_sync(self, digest: str) -> bool:
        return _DIGEST.match(digest) is not None and self._path(digest).exists()

    async def put(self, data: bytes) -> str:
        return await asyncio.to_thread(self.put_sync, data)

    async def get(self, digest: str) -> bytes:
        return await asyncio.to_thread(self.get_sync, digest)

    async def exists(self, digest: str) -> bool:
        return self.exists_sync(digest)


class S3BlobStore:
    """Blobs as objects ``<prefix>/ab/cdef…`` in an S3 bucket, through ``boto3``.

    Credentials come from boto3's usual chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, a profile, an
    instance role); ``endpoint_url`` points it at a non-AWS store (MinIO, or moto's server in the tests). boto3's
    client is synchronous and thread-safe, so every call runs in a worker thread.

    Args:
        bucket: The bucket; created if missing (``create_bucket=True``) so a fresh MinIO works out of the box.
        prefix: Key prefix inside the bucket ("" for none).
        endpoint_url: The S3 endpoint, when not AWS's own.
        region: The region boto3 signs for (any value works for MinIO and moto).
    """

    def __init__(self, *, bucket: str, prefix: str = "", endpoint_url: str | None = None,
                 region: str = "us-east-1", create_bucket: bool = True) -> None:
        import boto3  # type: ignore[import-untyped]  # imported here: a second of import time the API and CLI never need
        from botocore.config import Config  # type: ignore[import-untyped]

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client: Any = boto3.client("s3", endpoint_url=endpoint_url, region_name=region,
                                         config=Config(retries={"max_attempts": 5, "mode": "standard"}))
        if create_bucket:
            self._ensure_bucket()

    def _ensure_bucket(self) -> None:
        from botocore.exceptions import ClientError  # type: ignore[import-untyped]

        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError:
            try:
                self._client.create_bucket(Bucket=self.bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou",
                                                                     "BucketAlreadyExists"):
                    raise BlobError(f"cannot create bucket {self.bucket}: {exc}") from exc

    def _key(self, digest: str) -> str:
        key = f"{digest[:2]}/{digest[2:]}"
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_sync(self, data: bytes) -> str:
        digest = blob_id(data)
        try:
            self._client.put_object(Bucket=self.bucket, Key=self._key(digest), Body=data)
        except Exception as exc:  # botocore raises many unrelated types; all mean "not stored"
            raise BlobError(f"cannot store blob {digest} in {self.url}: {exc}") from exc
        return digest

    def get_sync(self, digest: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            obj = self._client.get_object(Bucket=self.bucket, Key=self._key(_check_id(digest)))
            data: bytes = obj["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise BlobNotFound(f"no blob {digest} in {self.url}") from None
            raise BlobError(f"cannot read blob {digest} from {self.url}: {exc}") from exc
        return _verified(digest, data)

    def exists_sync(self, digest: str) -> bool:
        from botocore.exceptions import ClientError

        if not _DIGEST.match(digest):
            return False
        try:
            self._client.head_object(Bucket=self.bucket, Key=self._key(digest))
        except ClientError:
            return False
        return True

    async def put(self, data: bytes) -> str:
        return await asyncio.to_thread(self.put_sync, data)

    async def get(self, digest: str) -> bytes:
        return await asyncio.to_thread(self.get_sync, digest)

    async def exists(self, digest: str) -> bool:
        return _DIGEST.match(digest) is not None and await asyncio.to_thread(self.exists_sync, digest)


def open_blob_store(url: str, *, endpoint_url: str | None = None) -> BlobStore:
    """The store at ``url``: ``file:///path`` (or a bare path) or ``s3://bucket[/prefix]``.

    Raises:
        ValueError: any other scheme (naming the accepted ones).
    """
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        return DirBlobStore(Path(parts.path if parts.scheme else url))
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"blob store {url!r} names no bucket (s3://bucket/prefix)")
        return S3BlobStore(bucket=parts.netloc, prefix=parts.path, endpoint_url=endpoint_url)
    raise ValueError(f"blob store {url!r}: the scheme must be file:// or s3://")


__all__ = ["BlobError", "BlobNotFound", "BlobStore", "DirBlobStore", "S3BlobStore", "blob_id", "open_blob_store"]
