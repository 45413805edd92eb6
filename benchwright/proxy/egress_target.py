"""Request targets the egress proxy accepts: ``CONNECT host:port`` authorities and absolute ``http://`` URIs,
canonicalised (:func:`~benchwright.proxy.policy.normalize_host`) before the policy sees them. Anything else is
answered 400 (a :class:`~benchwright.proxy.egress_http.ClientError`)."""

from __future__ import annotations

import re

from benchwright.proxy.egress_http import ClientError
from benchwright.proxy.policy import normalize_host

__all__ = ["parse_authority", "parse_http_uri"]

_PORT_RE = re.compile(r"^[0-9]{1,5}$")


def parse_authority(text: str, default_port: int | None) -> tuple[str, int]:
    """``host[:port]`` / ``[v6][:port]`` → (canonical host, port); raises ClientError(400)."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ClientError(400, f"invalid authority {text!r}")
        host_text, rest = text[: end + 1], text[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ClientError(400, f"invalid authority {text!r}")
        port_text: str | None = rest[1:] if rest else None
    else:
        if text.count(":") > 1:
            raise ClientError(400, f"invalid authority {text!r} (IPv6 literals must be in brackets)")
        host_text, sep, after = text.partition(":")
        port_text = after if sep else None
    if not port_text:  # absent, or "host:" which RFC 3986 reads as the default port
        if default_port is None:
            raise ClientError(400, f"CONNECT target {text!r} must be host:port")
        port = default_port
    elif not _PORT_RE.match(port_text) or not 1 <= int(port_text) <= 65535:
        raise ClientError(400, f"invalid port in {text!r}")
    else:
        port = int(port_text)
    try:
        host = normalize_host(host_text)
    except ValueError as exc:
        raise ClientError(400, f"invalid host: {exc}") from exc
    return host, port


def parse_http_uri(target: str) -> tuple[str, int, str, str]:
    """An absolute ``http://`` request target → (canonical host, port, authority as given, origin-form path)."""
    scheme, sep, rest = target.partition("://")
    if not sep:
        raise ClientError(
            400, f"not a proxy request: the target {target[:200]!r} must be an absolute http:// URI (or use CONNECT)"
        )
    if scheme.lower() == "https":
        raise ClientError(400, "https:// URIs must be tunnelled with CONNECT host:443")
    if scheme.lower() != "http":
        raise ClientError(400, f"unsupported URI scheme {scheme[:20]!r}")
    cut = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if "@" in authority:
        # Userinfo is a classic way to make "allowed.com@evil.com" look like the allowed host; refuse it outright.
        raise ClientError(400, "userinfo in the request URI is not allowed")
    if not authority:
        raise ClientError(400, "the request URI has no host")
    host, port = parse_authority(authority, 80)
    path = path.split("#", 1)[0]
    if not path.startswith("/"):
        path = "/" + path
    return host, port, authority, path

