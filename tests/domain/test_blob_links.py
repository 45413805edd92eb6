"""Cache hits and pins put large blobs in work directories as hard links (``BlobStore.copy_to``): the writers of
those files must break the link (temporary file + rename), never write the stored object."""

from __future__ import annotations

import json
import os
from pathlib import Path

from benchwright.data.datasets import analyze_dataset, keep_rows
from benchwright.registry.blobs import LINK_MIN_BYTES, BlobStore


def _rows(n: int) -> bytes:
    pad = "x" * 200
    return "".join(json.dumps({"question": f"q{i}", "answer": str(i), "pad": pad}) + "\n"
                   for i in range(n)).encode()


def test_a_large_blob_is_linked_read_only_and_a_small_one_copied(tmp_path: Path) -> None:
    blobs, work = BlobStore(tmp_path / "store"), tmp_path / "work"
    work.mkdir()
    big = _rows(LINK_MIN_BYTES // 200 + 10)
    big_sha, small_sha = blobs.put_bytes(big), blobs.put_bytes(b'{"path": "dataset.jsonl"}')
    blobs.copy_to(big_sha, work / "dataset.jsonl")
    blobs.copy_to(small_sha, work / "fetch.json")
    linked = os.stat(work / "dataset.jsonl")
    assert linked.st_ino == os.stat(blobs.path(big_sha)).st_ino and linked.st_mode & 0o777 == 0o400
    assert (work / "dataset.jsonl").read_bytes() == big
    copied = os.stat(work / "fetch.json")
    assert copied.st_ino != os.stat(blobs.path(small_sha)).st_ino and copied.st_mode & 0o777 == 0o644
    blobs.copy_to(big_sha, work / "dataset.jsonl")  # again over the same name (a retried cache hit)
    assert not (work / "dataset.jsonl.part").exists()


def test_the_writers_of_linked_files_leave_the_stored_object_alone(tmp_path: Path) -> None:
    blobs, work = BlobStore(tmp_path / "store"), tmp_path / "work"
    work.mkdir()
    rows = _rows(LINK_MIN_BYTES // 200 + 10)
    sha = blobs.put_bytes(rows)
    blobs.copy_to(sha, work / "dataset.jsonl")
    blobs.copy_to(sha, work / "tasks.jsonl")
    # Analyze normalizes over a linked tasks.jsonl, then keeps a subset of it.
    analysis = analyze_dataset(source=work / "dataset.jsonl", fmt="jsonl", tasks_path=work / "tasks.jsonl")
    keep_rows(work / "tasks.jsonl", [0, 2])
    assert [json.loads(line)["question"] for line in (work / "tasks.jsonl").open()] == ["q0", "q2"]
    assert analysis.rows == rows.count(b"\n")
    assert blobs.path(sha).read_bytes() == rows  # the object (and the dataset still linked to it) unchanged
    assert (work / "dataset.jsonl").read_bytes() == rows
    assert os.stat(work / "tasks.jsonl").st_ino != os.stat(blobs.path(sha)).st_ino
