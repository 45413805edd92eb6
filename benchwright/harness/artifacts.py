"""Run artifacts a harness leaves (its native log): stored under their sha256, named by a HarnessLogArtifact event.

The event is the record (which file, its digest and size); the bytes live in ``<data_dir>/artifacts/<run_id>/``
(object storage in production), written once under their digest, so a retried batch rewrites nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from benchwright.errors import NotFound

_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def store_artifact(data_dir: Path, *, run_id: str, data: bytes) -> str:
    """Keep ``data`` for the run; returns its sha256."""
    digest = hashlib.sha256(data).hexdigest()
    path = data_dir / "artifacts" / run_id / digest
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".part")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return digest


def artifact_path(data_dir: Path, *, run_id: str, digest: str) -> Path:
    """Where a stored artifact is.

    Raises:
        NotFound: no such artifact for the run.
    """
    path = data_dir / "artifacts" / run_id / digest
    if not _DIGEST.match(digest) or not path.is_file():
        raise NotFound(f"run {run_id} has no artifact {digest}")
    return path
