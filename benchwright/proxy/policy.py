"""Per-account egress host policy: which hosts a work/task sandbox may reach (product concept §11).

A policy is a default mode plus rules, each a host pattern with an action::

    HostPolicy(default="block", rules=[HostRule(pattern="pypi.org", action="allow"),
                                       HostRule(pattern="*.pythonhosted.org", action="allow")])

Pattern forms (all case-insensitive; a trailing dot is ignored; the stored pattern is normalized to lower case
without the trailing dot):

* ``pypi.org`` — exactly that DNS name.
* ``*.pythonhosted.org`` — any name *below* ``pythonhosted.org``, at any depth (``files.pythonhosted.org``,
  ``a.b.pythonhosted.org``) but **not** ``pythonhosted.org`` itself. This follows the usual wildcard reading (a
  ``*`` label stands for at least one label) and keeps "the apex" and "its subdomains" separately controllable;
  add both ``x.org`` and ``*.x.org`` to cover both.
* ``203.0.113.7`` — an IPv4 literal (canonical dotted quad only).
* ``[2001:db8::1]`` — an IPv6 literal, in brackets (the colons would otherwise be ambiguous with a port).
  IPv4-mapped IPv6 (``[::ffff:10.0.0.1]``) is treated as the IPv4 address it maps to, for patterns and hosts
  alike, so it cannot be used to sidestep an IPv4 rule.
* Any of the above with ``:port`` (``pypi.org:443``, ``*.corp.example:8080``, ``[::1]:8000``): the rule then
  applies only to that port. Without a port a rule applies to every port.

Rejected, with a ``ValueError`` that says why: empty patterns, whitespace, URLs (``https://x``), paths, userinfo,
``*`` anywhere but as the whole leftmost label, wildcards over IP literals, unbracketed IPv6, non-ASCII names
(write the ``xn--`` form), non-canonical numeric hosts (``127.1``, ``0x7f.0.0.1``, ``2130706433`` — resolvers
accept those as IPv4, so they would dodge an IP rule), and a bare ``*``: it would match every host, which is
exactly what the policy's ``default`` already expresses; allowing it would give two spellings of one setting
and make "which one wins" a question users have to ask.

Rules match on the host *name* the client asked for. An IP rule only matches requests that use that IP literal;
a name that resolves to the IP is decided by its name.

See :func:`decide` for precedence.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr, field_validator

__all__ = ["HostPolicy", "HostRule", "decide", "normalize_host"]

Action = Literal["allow", "block"]

# RFC 1123 labels, plus "_" because real service names carry it and refusing them would only surprise users.
_LABEL_RE = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
# A last label that a resolver would read as (part of) a number: decimal digits or 0x-hex (inet_aton forms).
_NUMERIC_LABEL_RE = re.compile(r"^(?:[0-9]+|0x[0-9a-f]*)$")
_PORT_RE = re.compile(r"^[0-9]{1,5}$")
_MAX_NAME_LEN = 253


@dataclass(frozen=True, slots=True)
class _Parsed:
    """A validated pattern: ``kind`` is ``exact`` or ``wildcard``; ``host`` is canonical (the wildcard's suffix)."""

    kind: Literal["exact", "wildcard"]
    host: str
    port: int | None


def _canonical_ip(text: str) -> str | None:
    """Canonical form of an IP literal (``1.2.3.4`` or ``[v6]``), or None if ``text`` is not one.

    ``text`` is an IPv4 dotted quad or a bare IPv6 address (no brackets). IPv4-mapped IPv6 folds to IPv4 so
    ``[::ffff:127.0.0.1]`` and ``127.0.0.1`` are one host for the policy, as they are for the network.
    """
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id is not None:
            return None
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return f"[{ip.compressed}]"
    return str(ip)


def _canonical_name(name: str, *, what: str) -> str:
    """Validate and canonicalize a DNS name or IPv4 literal (already lower-cased, no port, no brackets)."""
    if name.endswith("."):
        name = name[:-1]
    if not name:
        raise ValueError(f"{what} is empty")
    if not name.isascii():
        raise ValueError(f"{what} {name!r} is not ASCII; write internationalized names in their 'xn--' form")
    if len(name) > _MAX_NAME_LEN:
        raise ValueError(f"{what} is longer than {_MAX_NAME_LEN} characters")
    labels = name.split(".")
    if _NUMERIC_LABEL_RE.match(labels[-1]):
        # No TLD is numeric, so this is meant as an IP; only the canonical dotted quad is accepted because
        # resolvers also take 127.1, 0x7f.0.0.1, 2130706433 ... and a rule on 127.0.0.1 must not be dodgeable.
        ip = _canonical_ip(name)
        if ip is None or ip.startswith("["):
            raise ValueError(f"{what} {name!r} looks numeric but is not a canonical IPv4 address (like 10.0.0.1)")
        return ip
    for label in labels:
        if not _LABEL_RE.match(label):
            raise ValueError(
                f"{what} {name!r} has an invalid label {label!r} "
                "(labels are 1-63 of a-z, 0-9, '-', '_' and do not start or end with '-')"
            )
    return name


def _split_port(text: str, *, what: str) -> tuple[str, int | None]:
    """Split ``host[:port]`` / ``[v6][:port]`` into host text and port."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"{what} {text!r} opens '[' without closing ']'")
        host, rest = text[: end + 1], text[end + 1 :]
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError(f"{what} {text!r} has unexpected text after ']'")
        port_text = rest[1:]
    else:
        if text.count(":") > 1:
            raise ValueError(
                f"{what} {text!r} looks like an IPv6 address; write IPv6 literals in brackets, e.g. '[::1]'"
            )
        if ":" not in text:
            return text, None
        host, port_text = text.split(":", 1)
    if not _PORT_RE.match(port_text) or not 1 <= int(port_text) <= 65535:
        raise ValueError(f"{what} {text!r} has an invalid port {port_text!r} (expected 1-65535)")
    return host, int(port_text)


def _canonical_host(host: str, *, what: str) -> str:
    """Canonical host key for a host without port: DNS name, IPv4 dotted quad, or ``[v6]``."""
    if host.startswith("["):
        if not host.endswith("]"):
            raise ValueError(f"{what} {host!r} opens '[' without closing ']'")
        ip = _canonical_ip(host[1:-1])
        if ip is None:
            raise ValueError(f"{what} {host!r} is not a valid IPv6 address")
        return ip
    return _canonical_name(host.lower(), what=what)


def _parse_pattern(pattern: str) -> _Parsed:
    """Validate a rule pattern; raises ValueError with a message meant for the person who wrote it."""
    what = "host pattern"
    if not pattern:
        raise ValueError("host pattern must not be empty")
    if any(ch.isspace() for ch in pattern):
        raise ValueError(f"host pattern {pattern!r} must not contain whitespace")
    if "://" in pattern:
        raise ValueError(f"host pattern {pattern!r} is a URL; give only the host, e.g. 'pypi.org' (no scheme)")
    if "/" in pattern or "?" in pattern or "#" in pattern:
        raise ValueError(f"host pattern {pattern!r} contains a path; give only the host, e.g. 'pypi.org'")
    if "@" in pattern:
        raise ValueError(f"host pattern {pattern!r} contains userinfo ('@'); give only the host")
    if pattern == "*" or pattern.startswith("*:"):
        raise ValueError(
            "host pattern '*' would match every host; set the policy's default to 'allow' or 'block' instead"
        )
    if pattern.startswith("*.["):
        raise ValueError(f"host pattern {pattern!r}: wildcards apply to DNS names, not IP addresses")
    text = pattern.lower()
    host, port = _split_port(text, what=what)
    if "*" in host:
        if not host.startswith("*.") or "*" in host[2:]:
            raise ValueError(
                f"host pattern {pattern!r}: '*' is only allowed as the whole leftmost label, e.g. '*.example.com'"
            )
        suffix_text = host[2:].rstrip(".")
        if suffix_text.startswith("[") or _NUMERIC_LABEL_RE.match(suffix_text.rsplit(".", 1)[-1]):
            raise ValueError(f"host pattern {pattern!r}: wildcards apply to DNS names, not IP addresses")
        return _Parsed("wildcard", _canonical_host(host[2:], what=what), port)
    return _Parsed("exact", _canonical_host(host, what=what), port)


def normalize_host(host: str) -> str:
    """Canonical form of a request's host, as rules see it and as the blocked-host log records it.

    Lower-cases DNS names and drops a trailing dot; IPv4 stays a dotted quad; IPv6 (bare or bracketed) becomes
    ``[compressed]``; IPv4-mapped IPv6 becomes its IPv4 address.

    Args:
        host: A host without port: ``PyPI.org.``, ``127.0.0.1``, ``::1`` or ``[::1]``.

    Returns:
        The canonical host string.

    Raises:
        ValueError: ``host`` is not a valid DNS name or IP literal (including non-canonical numeric forms such
            as ``127.1``, which resolvers would silently turn into an IP).
    """
    if not host:
        raise ValueError("host is empty")
    if any(ch.isspace() for ch in host) or "*" in host or "@" in host or "/" in host:
        raise ValueError(f"host {host!r} contains characters not allowed in a host name")
    if not host.startswith("[") and host.count(":") > 1:
        host = f"[{host}]"  # bare IPv6, e.g. from a resolver or a CONNECT target already split from its port
    if ":" in host and not host.startswith("["):
        raise ValueError(f"host {host!r} must not include a port; pass the port separately")
    return _canonical_host(host, what="host")


class HostRule(BaseModel):
    """One rule: a host pattern and what to do with hosts it matches (pattern syntax: module docstring)."""

    model_config = ConfigDict(extra="forbid")

    pattern: str
    action: Action

    _parsed: tuple[str, _Parsed] | None = PrivateAttr(default=None)

    @field_validator("pattern")
    @classmethod
    def _validate_pattern(cls, value: str) -> str:
        parsed = _parse_pattern(value)
        return _format_pattern(parsed)

    def _get_parsed(self) -> _Parsed:
        # Parsed once and cached so decide() does not re-validate every rule on every request; lazily, because
        # model_construct()/model_copy(update=...) skip validators.
        cached = self._parsed
        if cached is None or cached[0] != self.pattern:
            cached = self._parsed = (self.pattern, _parse_pattern(self.pattern))
        return cached[1]

    def _specificity(self, host: str, port: int | None) -> tuple[int, int, int] | None:
        """How specifically this rule matches ``host`` (canonical) and ``port``; None if it does not match.

        Tuples compare host first (exact=2 beats wildcard=1; then longer wildcard suffixes by label count), then
        port (a rule naming the port beats one that applies to every port).
        """
        parsed = self._get_parsed()
        if parsed.port is not None and parsed.port != port:
            return None
        port_rank = 1 if parsed.port is not None else 0
        if parsed.kind == "exact":
            return (2, 0, port_rank) if host == parsed.host else None
        if host.endswith("." + parsed.host):
            return (1, parsed.host.count(".") + 1, port_rank)
        return None


def _format_pattern(parsed: _Parsed) -> str:
    """The normalized spelling of a parsed pattern (what ``HostRule.pattern`` stores)."""
    host = f"*.{parsed.host}" if parsed.kind == "wildcard" else parsed.host
    return host if parsed.port is None else f"{host}:{parsed.port}"


class HostPolicy(BaseModel):
    """An account's egress policy: ``default`` for hosts no rule matches, and the rules."""

    model_config = ConfigDict(extra="forbid")

    default: Action = "allow"
    rules: list[HostRule] = []


def decide(policy: HostPolicy, host: str, port: int | None = None) -> tuple[bool, str]:
    """Whether ``policy`` lets a sandbox reach ``host`` (on ``port``), and a human-readable reason.

    Precedence:

    1. Only rules that match take part: the host matches (case-insensitive, trailing dot ignored, see
       :func:`normalize_host`) and, if the rule names a port, ``port`` equals it. With ``port=None`` rules that
       name a port never match.
    2. The most specific matching rule wins: an exact host beats any wildcard; among wildcards the longer suffix
       (more labels: ``*.a.example.com`` over ``*.example.com``) wins; for the same host pattern a rule that
       names the port beats one that does not.
    3. Between equally specific rules with different actions, ``block`` wins (fail closed on contradictions).
    4. If no rule matches, the policy's ``default`` applies.

    A host that is not a valid DNS name or canonical IP literal is refused (``normalize_host`` explains why).

    Args:
        policy: The account's policy.
        host: The requested host, without port (``pypi.org``, ``127.0.0.1``, ``[::1]``).
        port: The requested port, if known.

    Returns:
        ``(allowed, reason)``; the reason names the deciding rule or the default.
    """
    try:
        canonical = normalize_host(host)
    except ValueError as exc:
        return False, f"invalid host: {exc}"
    best: tuple[int, int, int] | None = None
    best_rule: HostRule | None = None
    for rule in policy.rules:
        spec = rule._specificity(canonical, port)
        if spec is None:
            continue
        if best is None or spec > best or (spec == best and rule.action == "block"):
            best, best_rule = spec, rule
    if best_rule is not None:
        verb = "allowed" if best_rule.action == "allow" else "blocked"
        return best_rule.action == "allow", f"{verb} by rule {best_rule.pattern!r}"
    verb = "allowed" if policy.default == "allow" else "blocked"
    return policy.default == "allow", f"{verb} by the default ({policy.default}); no rule matches {canonical!r}"
