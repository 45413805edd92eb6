"""The registry's blob store on two hosts: each keeps its own local object directory (its data dir), both are
backed by one shared S3 store (moto's S3 server, a real S3 protocol server on a free port for this module)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchwright.data.blobs import S3BlobStore, blob_id
from benchwright.errors import NotFound
from benchwright.registry.blobs import LINK_MIN_BYTES, BlobStore
from benchwright.settings import Settings
from benchwright.testkit.moto_s3 import MotoS3, moto_s3_in_env


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoS3]:
    with moto_s3_in_env() as server:
        yield server


def _host(moto: MotoS3, data_dir: Path, bucket: str) -> BlobStore:
    """A worker's registry store as the worker builds it: from its settings (its own data dir, the shared store)."""
    return BlobStore.from_settings(Settings(data_dir=data_dir, blob_store_url=f"s3://{bucket}/blobs",
                                            blob_s3_endpoint_url=moto.endpoint_url))


def test_a_blob_put_through_host_a_is_read_through_host_b(moto: MotoS3, tmp_path: Path) -> None:
    host_a = _host(moto, tmp_path / "a", "bw-registry-ab")
    # Host B has its own S3 client: nothing but the S3 server is shared between the two.
    host_b = BlobStore(Settings(data_dir=tmp_path / "b").sandboxes_dir() / "snapshots",
                       shared=S3BlobStore(bucket="bw-registry-ab", prefix="blobs", endpoint_url=moto.endpoint_url))
    scorer = b"class Scorer:\n    pass\n"
    dataset = os.urandom(LINK_MIN_BYTES + 4096)
    (tmp_path / "dataset.jsonl").write_bytes(dataset)
    impl_sha, data_sha = host_a.put_bytes(scorer), host_a.put_file(tmp_path / "dataset.jsonl")
    assert (impl_sha, data_sha) == (blob_id(scorer), blob_id(dataset))

    assert not host_b.path(impl_sha).exists() and not host_b.path(data_sha).exists()
    assert host_b.read_bytes(impl_sha) == scorer  # fetched on demand ...
    assert host_b.path(impl_sha).read_bytes() == scorer  # ... into B's local store, which is now its cache
    assert host_b.has(data_sha) and host_b.path(data_sha).read_bytes() == dataset
    work = tmp_path / "b-work"
    work.mkdir()
    host_b.copy_to(data_sha, work / "dataset.jsonl")  # the local fast path: a hard link to B's own object
    assert os.stat(work / "dataset.jsonl").st_ino == os.stat(host_b.path(data_sha)).st_ino
    assert os.stat(host_b.path(data_sha)).st_mode & 0o777 == 0o400

    missing = blob_id(b"nobody stored this")
    assert not host_b.has(missing)
    with pytest.raises(NotFound):
        host_b.read_bytes(missing)
    with pytest.raises(NotFound):
        host_b.copy_to(missing, work / "nothing")


def test_a_blob_host_b_puts_back_is_readable_by_host_a_and_a_local_only_store_stays_local(
        moto: MotoS3, tmp_path: Path) -> None:
    host_a, host_b = _host(moto, tmp_path / "a", "bw-registry-ba"), _host(moto, tmp_path / "b", "bw-registry-ba")
    # An object B already held locally (a snapshot object taken before the shared store was configured) is still
    # uploaded when it is put.
    old = b"taken before the shared store existed"
    local_only = BlobStore(host_b.root)
    assert local_only.shared is None and local_only.put_bytes(old) == blob_id(old)
    assert host_b.put_bytes(old) == blob_id(old)
    assert host_a.read_bytes(blob_id(old)) == old
    # Without blob_store_url a worker's registry store is its local directory alone (the embedded stack).
    alone = BlobStore.from_settings(Settings(data_dir=tmp_path / "c"))
    assert alone.shared is None and not alone.has(blob_id(old))
