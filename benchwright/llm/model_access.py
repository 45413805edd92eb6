"""Where a run's model calls may go: the launch's ``api_base`` is a place a user names, so it is checked like a
dataset URL before the credential proxy sends the run's key (and its prompts) there.

A model endpoint is refused when

1. its scheme is not http or https, or its host is not a valid DNS name or IP literal;
2. the account's host policy blocks the host (:func:`~benchwright.proxy.policy.decide`), the same rules its
   sandboxes' egress and its dataset downloads obey;
3. any address the host resolves to is inside the platform's network (loopback, private, link-local and so the
   cloud metadata address, ...: :func:`~benchwright.proxy.addresses.internal_reason`), unless the operator listed
   that exact endpoint in ``model_internal_allowed`` (a self-hosted vLLM on the private network, say) or the
   account is trusted with the machine (``local_paths`` on a deployment that allows local paths: the owner of an
   embedded ``benchwright up`` stack, who may already read its files and so gains nothing by calling its
   loopback; their models on localhost, the dev model among them, just work).

The check returns the address it approved, and the proxy connects to exactly that address (Host header and TLS
name stay the URL's), so a DNS answer cannot rebind the run's calls to an internal address after the check. A
model named without ``api_base`` goes to its provider's own public endpoint and needs no check.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from benchwright.errors import InvalidInput
from benchwright.proxy.addresses import Endpoint, endpoint_allowed, first_internal
from benchwright.proxy.policy import HostPolicy, decide, normalize_host


class ModelEndpointRefused(InvalidInput):
    code = "model_endpoint_refused"


@dataclass(frozen=True)
class ModelAccess:
    """Everything one run's model route may reach."""

    policy: HostPolicy
    internal_allowed: frozenset[Endpoint] = frozenset()
    """The operator's ``model_internal_allowed`` endpoints."""
    trusted_local: bool = False
    """The account may name internal endpoints (module docstring, rule 3)."""


def check_api_base(api_base: str, access: ModelAccess, *, on_refused: Callable[[str], None] = lambda host: None,
                   resolve: Callable[..., list[tuple[Any, ...]]] = socket.getaddrinfo) -> str | None:
    """The address the run's model calls to ``api_base`` must connect to, after the checks of the module
    docstring. ``on_refused(host)`` is called before a refusal that names a host (the blocked-host log).

    Returns:
        The approved IP address, or None when the host does not resolve (the calls then fail as unreachable,
        with the resolver's words, like any dead endpoint).

    Raises:
        ModelEndpointRefused: a rule refused the endpoint; the message names the rule.
    """
    parts = urlsplit(api_base)
    if parts.scheme not in ("http", "https"):
        raise ModelEndpointRefused(f"model api_base {api_base} uses scheme {parts.scheme!r}; only http and https")
    try:
        host = normalize_host(parts.hostname or "")
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        on_refused(parts.hostname or "(empty host)")
        raise ModelEndpointRefused(f"model api_base {api_base} has an invalid host or port: {exc}") from None
    allowed, reason = decide(access.policy, host, port)
    if not allowed:
        on_refused(host)
        raise ModelEndpointRefused(f"calling the model at {host} was refused: {host} is blocked by the account's "
                                   f"host policy ({reason})")
    bare = host[1:-1] if host.startswith("[") else host
    try:
        infos = resolve(bare, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return None
    address = str(infos[0][4][0])
    if access.trusted_local or endpoint_allowed(access.internal_allowed, host=bare, address=address, port=port):
        return address
    inside = first_internal(infos)
    if inside is not None:
        on_refused(host)
        raise ModelEndpointRefused(
            f"calling the model at {host} was refused: it resolves to an internal address ({inside[0]}: {inside[1]});"
            f" an operator can allow this endpoint with BENCHWRIGHT_MODEL_INTERNAL_ALLOWED='[\"{bare}:{port}\"]'")
    return address
