"""Compute backend selection (§4): the run's field, else the account's saved provider, else the deployment's.

A typo is refused at launch rather than silently falling back; a backend that exists in the product but is not
configured on this deployment is refused with a message saying so.
"""

from __future__ import annotations

from benchwright.errors import InvalidInput
from benchwright.schemas import suggest

BACKENDS = ("local", "sandbox0", "e2b")
COMPUTE_CHOICES = (*BACKENDS, "default", "auto")
HOW_TO_CONFIGURE = {
    "sandbox0": "set BENCHWRIGHT_SANDBOX0_KUBECONFIG to a kubeconfig file (or BENCHWRIGHT_SANDBOX0_IN_CLUSTER=true "
                "for a worker running in the cluster)",
    "e2b": "set BENCHWRIGHT_E2B_API_KEY to an E2B API key",
}
"""What an operator sets to configure each backend that is not always there; named in the 400 that refuses it."""


def check_compute(value: str, *, configured: tuple[str, ...]) -> str:
    """Validate a named backend.

    Raises:
        InvalidInput: not a known value (naming the allowed ones), or not configured here.
    """
    if value not in COMPUTE_CHOICES:
        raise InvalidInput(f"compute '{value}' is not one of {', '.join(COMPUTE_CHOICES)}"
                           f"{suggest(value, COMPUTE_CHOICES)}", code="invalid_compute")
    if value in BACKENDS and value not in configured:
        raise InvalidInput(f"compute backend '{value}' is not configured on this deployment "
                           f"(configured: {', '.join(configured)}); to configure it, "
                           f"{HOW_TO_CONFIGURE.get(value, 'see docs/backends.md')} on the API and the workers",
                           code="compute_not_configured")
    return value


def resolve_compute(*, requested: str | None, saved: str | None, default: str, configured: tuple[str, ...]) -> str:
    """The backend a run gets: its own field, else the account's saved provider, else the deployment default."""
    if requested is not None:
        check_compute(requested, configured=configured)
        if requested in BACKENDS:
            return requested
    if saved is not None and saved in configured:
        return saved
    return default


def materialize_mode(*, backend: str, local_mode: str = "sequential", product_sandbox_snapshot: bool = False,
                     harness_bridge: bool = False) -> str:
    """Sequential or fanout, from the run's infrastructure alone, in §4's order: a product-sandbox run with a
    snapshot to restore gets fanout; a harness-bridge run sequential; an E2B run fanout (it spawns fast enough);
    the local backend whatever its deployment setting says; everything else (sandbox0) sequential."""
    if product_sandbox_snapshot:
        return "fanout"
    if harness_bridge:
        return "sequential"
    if backend == "e2b":
        return "fanout"
    if backend == "local":
        return local_mode
    return "sequential"
