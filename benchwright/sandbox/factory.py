"""The one place a sandbox backend is made: from the run's recorded ``compute`` and the deployment's settings.

Every place that creates, restores, snapshots or kills a sandbox gets its backend here (through
:mod:`benchwright.sandbox.lifecycle`), so a run's sandboxes are all on the backend its launch resolved (§4) and
every SandboxCreated names the backend that really made the sandbox. A backend that is named but not configured is
refused, naming what to configure; nothing falls back to another backend.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass
from pathlib import Path

from benchwright.data.blobs import BlobStore, open_blob_store
from benchwright.errors import InvalidInput
from benchwright.sandbox.base import SandboxBackend
from benchwright.sandbox.compute import BACKENDS, HOW_TO_CONFIGURE
from benchwright.sandbox.local import LocalBackend
from benchwright.settings import Settings


@dataclass
class OpenBackend:
    """A backend for one use, with what callers need to know about its sandboxes.

    Attributes:
        backend: The backend object (close it when done).
        python: The interpreter that runs the scorer runtime inside its sandboxes.
        usd_per_hour: Its rate for its instance size (§9: cost.sandbox = Σ lifetime × rate).
    """

    backend: SandboxBackend
    python: str
    usd_per_hour: float


def blob_store(settings: Settings) -> BlobStore:
    """The deployment's blob store: ``blob_store_url``, else ``<data_dir>/blobs`` (one object per location, so an
    S3 client and its connection pool are made once per process)."""
    return _blob_store(settings.blob_store_url or str(settings.data_dir / "blobs"), settings.blob_s3_endpoint_url)


@functools.lru_cache(maxsize=8)
def _blob_store(url: str, endpoint_url: str | None) -> BlobStore:
    return open_blob_store(url, endpoint_url=endpoint_url)


def sandbox_rate(settings: Settings, *, backend: str, instance_size: str) -> float:
    """USD per hour of one sandbox of ``instance_size`` on ``backend``.

    Raises:
        InvalidInput: a remote backend's size has no rate (cost.sandbox would silently read 0).
    """
    rate = settings.sandbox_usd_per_hour.get(instance_size)
    if rate is not None:
        return rate
    if backend == "local":
        return settings.local_sandbox_usd_per_hour
    raise InvalidInput(f"no rate for {backend} instance size '{instance_size}': add it to "
                       f"BENCHWRIGHT_SANDBOX_USD_PER_HOUR (known: {', '.join(sorted(settings.sandbox_usd_per_hour))})",
                       code="compute_not_configured")


def open_backend(settings: Settings, *, backend: str, egress_proxy_url: str | None = None,
                 blobs: BlobStore | None = None, ro_paths: tuple[Path, ...] = ()) -> OpenBackend:
    """The backend named ``backend`` (a run's recorded compute), its sandboxes' egress through ``egress_proxy_url``;
    ``ro_paths`` are host directories its sandboxes see read-only (the local backend only).

    Raises:
        InvalidInput: not a backend, not configured on this deployment (naming what to configure), or host paths
            asked of a remote backend.
    """
    if backend not in BACKENDS:
        raise InvalidInput(f"compute backend '{backend}' is not one of {', '.join(BACKENDS)}", code="invalid_compute")
    if backend not in settings.configured_backends():
        raise InvalidInput(f"compute backend '{backend}' is not configured on this worker: "
                           f"{HOW_TO_CONFIGURE.get(backend, '')}", code="compute_not_configured")
    if ro_paths and backend != "local":
        raise InvalidInput(f"compute backend '{backend}' cannot mount the worker's host paths; a harness runtime "
                           "there must be part of its image or template", code="compute_not_supported")
    made: SandboxBackend
    if backend == "local":
        made = LocalBackend(settings.sandboxes_dir(), allow_unisolated=settings.allow_unisolated,
                            egress_proxy_url=egress_proxy_url, extra_ro_paths=ro_paths)
        python = sys.executable
    elif backend == "sandbox0":
        from benchwright.sandbox.sandbox0 import Sandbox0Backend, load_api_client

        made = Sandbox0Backend(api_client=load_api_client(settings.sandbox0_kubeconfig),
                               namespace=settings.sandbox0_namespace, image=settings.sandbox0_image,
                               blobs=blobs or blob_store(settings), instance_size=settings.sandbox0_instance_size,
                               egress_proxy_url=egress_proxy_url, pod_egress_url=settings.sandbox0_pod_egress_url)
        python = settings.sandbox0_python
    else:
        from benchwright.sandbox.e2b import E2BBackend

        assert settings.e2b_api_key is not None  # configured_backends() checked it
        made = E2BBackend(api_key=settings.e2b_api_key, blobs=blobs or blob_store(settings),
                          template=settings.e2b_template, instance_size=settings.e2b_instance_size,
                          egress_proxy_url=egress_proxy_url, api_url=settings.e2b_api_url,
                          sandbox_url=settings.e2b_sandbox_url)
        python = settings.e2b_python
    size = str(getattr(made, "instance_size", ""))
    return OpenBackend(backend=made, python=python,
                       usd_per_hour=sandbox_rate(settings, backend=backend, instance_size=size))


__all__ = ["OpenBackend", "blob_store", "open_backend", "sandbox_rate"]
