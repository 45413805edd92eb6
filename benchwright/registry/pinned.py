"""The launch side of pinned mode (§3): which launch bodies are pinned, what they may not combine, and how a pinned
subset snapshot is read back as a dataset."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import Engine
from sqlmodel import Session

from benchwright.errors import DatasetError, InvalidInput
from benchwright.registry.blobs import BlobStore
from benchwright.registry.catalog import REGISTRY_SOURCE, Pin, resolve_pinned
from benchwright.schemas import LaunchRequest
from benchwright.store.models import SubsetSnapshot


def resolve_pin(engine: Engine, blobs: BlobStore, *, account_id: str, launch: LaunchRequest) -> Pin | None:
    """The pin of a launch naming ``benchmark``/``subset``/``impl``, else None (after the dataset-side checks).

    Raises:
        InvalidInput: a dataset and a benchmark together; no dataset at all; a ``registry:`` dataset given by hand;
            ``public`` without a public benchmark (the message says why).
        NotFound: naming which of benchmark, subset or impl did not resolve.
    """
    pinned = launch.benchmark is not None or launch.subset is not None or launch.impl is not None
    if pinned and launch.dataset is not None:
        raise InvalidInput("give either a dataset or a pinned benchmark + subset (+ impl), not both",
                           code="dataset_and_benchmark")
    if not pinned:
        if launch.dataset is not None and launch.dataset.startswith(REGISTRY_SOURCE):
            raise InvalidInput(f"'{REGISTRY_SOURCE}' datasets are the registry's own; launch with benchmark and "
                               "subset instead", code="invalid_dataset")
        if launch.dataset is None and getattr(launch, "prompt", None) is None:
            raise InvalidInput("a launch needs a dataset (or a pinned benchmark + subset)", code="missing_dataset")
        if launch.dataset is not None and launch.visibility == "public":
            raise InvalidInput("a dataset launch cannot be public: public runs are listed on a public benchmark; "
                               "launch it private or unlisted and publish it (POST /v1/registry/publish)",
                               code="needs_public_benchmark")
        return None
    pin = resolve_pinned(engine, blobs, account_id=account_id, benchmark=launch.benchmark, subset=launch.subset,
                         impl=launch.impl)
    if launch.visibility == "public" and not pin.benchmark_public:
        raise InvalidInput(f"this run cannot be public: benchmark {pin.benchmark_id} is private (public runs are "
                           "listed on a public benchmark)", code="needs_public_benchmark")
    return pin


def fetch_pinned(engine: Engine, blobs: BlobStore, *, source: str, dest_dir: Path) -> tuple[Path, str, int]:
    """Copy a pinned subset snapshot (``registry:<subset_id>@<version>``) into ``dest_dir`` as its dataset.

    Returns:
        The file (JSONL), its sha256 and its size.

    Raises:
        DatasetError: no such snapshot, or its blob is missing.
    """
    subset_id, _, version = source[len(REGISTRY_SOURCE):].rpartition("@")
    with Session(engine) as session:
        snap = session.get(SubsetSnapshot, (subset_id, int(version))) if version.isdigit() else None
    if snap is None or not blobs.has(snap.tasks_sha256):
        raise DatasetError(f"the pinned subset snapshot {source} is not in the registry", code="fetch_failed")
    dest = dest_dir / "dataset.jsonl"
    dest_dir.mkdir(parents=True, exist_ok=True)
    blobs.copy_to(snap.tasks_sha256, dest)
    return dest, snap.tasks_sha256, dest.stat().st_size
