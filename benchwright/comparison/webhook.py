"""POSTing an alert to a URL a user named: untrusted egress under the same rules as Fetch (DESIGN invariant 8).

The worker sends it, outside any sandbox, so the URL must not become a way into the platform's network. The hop
is checked as ``benchwright.data.dataset_access`` checks a dataset URL: http(s) only; the account's host policy decides
the host (``benchwright.proxy.policy.decide``); the name is resolved once and every address must be public
(``benchwright.proxy.addresses.internal_reason``) unless the operator listed the exact endpoint in
``egress_internal_allowed``; the request goes to that checked address (Host header and TLS name stay the URL's), so
a second DNS answer cannot rebind it. No redirects are followed, environment proxies are ignored, and a short
timeout bounds it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

import httpx

from benchwright.errors import InvalidInput
from benchwright.proxy.addresses import Endpoint, endpoint_allowed, internal_reason
from benchwright.proxy.policy import HostPolicy, decide, normalize_host

__all__ = ["BLOCKED", "check_webhook", "check_webhook_url", "post_webhook"]

BLOCKED = "webhook_blocked"
TIMEOUT_S = 10.0


def check_webhook_url(url: str) -> tuple[str, int]:
    """The canonical host and port of a webhook URL (syntax only; policy and addresses are checked at send time).

    Raises:
        InvalidInput: ``invalid_webhook``: not http(s), or no valid host.
    """
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https"):
        raise InvalidInput(f"webhook {url} uses scheme {parsed.scheme!r}; only http and https are called",
                           code="invalid_webhook")
    try:
        host = normalize_host(parsed.host)
    except ValueError as exc:
        raise InvalidInput(f"webhook {url} has an invalid host: {exc}", code="invalid_webhook") from None
    return host, parsed.port or (443 if parsed.scheme == "https" else 80)


async def check_webhook(*, url: str, policy: HostPolicy, internal_allowed: frozenset[Endpoint],
                        on_refused: Callable[[str], None] = lambda host: None) -> str:
    """Every rule delivery applies to ``url`` before it sends (the one home of them: a schedule's create calls it
    too, so a webhook that can never be delivered is refused up front); returns the checked address to send to.

    Raises:
        InvalidInput: ``webhook_blocked`` (the host policy, or an internal address: permanent), naming the rule;
            ``invalid_webhook`` (not http(s), no valid host).
        OSError: the name does not resolve (``socket.gaierror``): transient for delivery.
    """
    host, port = check_webhook_url(url)
    allowed, reason = decide(policy, host, port)
    if not allowed:
        on_refused(host)
        raise InvalidInput(f"the webhook host {host} is blocked by the account's host policy ({reason})", code=BLOCKED)
    bare = host[1:-1] if host.startswith("[") else host
    infos = await asyncio.get_running_loop().getaddrinfo(bare, port, type=socket.SOCK_STREAM)
    address = str(infos[0][4][0])
    if not endpoint_allowed(internal_allowed, host=bare, address=address, port=port):
        for info in infos:
            why = internal_reason(str(info[4][0]))
            if why is not None:
                on_refused(host)
                raise InvalidInput(f"the webhook host {host} resolves to an internal address ({info[4][0]}: {why}); "
                                   "alerts are never sent into the platform's own network (unless the operator "
                                   "lists the endpoint in egress_internal_allowed)", code=BLOCKED)
    return address


async def post_webhook(*, url: str, payload: dict[str, Any], policy: HostPolicy, internal_allowed: frozenset[Endpoint],
                       on_refused: Callable[[str], None] = lambda host: None) -> int:
    """POST ``payload`` as JSON to ``url`` under the rules above (:func:`check_webhook`); returns the status.

    Raises:
        InvalidInput: ``webhook_blocked`` (policy or internal address; permanent), or ``invalid_webhook``.
        httpx.HTTPError: a network fault or an error status (transient: the caller retries).
    """
    address = await check_webhook(url=url, policy=policy, internal_allowed=internal_allowed, on_refused=on_refused)
    parsed = httpx.URL(url)
    async with httpx.AsyncClient(timeout=TIMEOUT_S, follow_redirects=False, trust_env=False) as client:
        request = client.build_request("POST", parsed.copy_with(host=address, fragment=None), json=payload,
                                       headers={"Host": parsed.netloc.decode("ascii")},
                                       extensions={"sni_hostname": parsed.host})
        resp = await client.send(request)
    resp.raise_for_status()
    return resp.status_code
