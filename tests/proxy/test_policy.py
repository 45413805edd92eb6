"""Host policy: pattern validation and the precedence of ``decide`` (table-driven)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from benchwright.proxy.policy import HostPolicy, HostRule, decide, normalize_host


def _policy(default: str, *rules: tuple[str, str]) -> HostPolicy:
    return HostPolicy(default=default, rules=[HostRule(pattern=p, action=a) for p, a in rules])


def test_fresh_policy_allows_everything() -> None:
    policy = HostPolicy()
    assert policy.default == "allow" and policy.rules == []
    assert decide(policy, "example.com", 443) == (True, "allowed by the default (allow); no rule matches 'example.com'")


PYPI = _policy("block", ("pypi.org", "allow"), ("*.pythonhosted.org", "allow"))
DENYLIST = _policy("allow", ("evil.example", "block"), ("*.tracker.example", "block"))
NESTED = _policy(
    "allow",
    ("*.example.com", "block"),
    ("*.cdn.example.com", "allow"),
    ("bad.cdn.example.com", "block"),
    ("good.example.com", "allow"),
)
TIES = _policy(
    "allow",
    ("both.example", "allow"),
    ("both.example", "block"),
    ("*.both.example", "block"),
    ("*.both.example", "allow"),
)
PORTS = _policy(
    "block",
    ("api.example", "allow"),
    ("api.example:25", "block"),
    ("*.svc.example:8443", "allow"),
    ("*.svc.example", "block"),
    ("[::1]:8000", "allow"),
)
IPS = _policy("allow", ("10.0.0.1", "block"), ("[2001:db8::1]", "block"), ("localhost", "block"))


@pytest.mark.parametrize(
    ("policy", "host", "port", "allowed", "reason"),
    [
        # default block + allow rules
        (PYPI, "pypi.org", 443, True, "allowed by rule 'pypi.org'"),
        (PYPI, "files.pythonhosted.org", 443, True, "allowed by rule '*.pythonhosted.org'"),
        (PYPI, "a.b.pythonhosted.org", 443, True, "allowed by rule '*.pythonhosted.org'"),
        (PYPI, "pythonhosted.org", 443, False, "blocked by the default (block); no rule matches 'pythonhosted.org'"),
        (PYPI, "xpythonhosted.org", 443, False, "blocked by the default (block); no rule matches 'xpythonhosted.org'"),
        (PYPI, "evil.org", 80, False, "blocked by the default (block); no rule matches 'evil.org'"),
        (PYPI, "pypi.org.evil.org", 443, False, "blocked by the default (block); no rule matches 'pypi.org.evil.org'"),
        # default allow + block rules
        (DENYLIST, "evil.example", 443, False, "blocked by rule 'evil.example'"),
        (DENYLIST, "x.tracker.example", 80, False, "blocked by rule '*.tracker.example'"),
        (DENYLIST, "tracker.example", 80, True, "allowed by the default (allow); no rule matches 'tracker.example'"),
        (DENYLIST, "good.example", 443, True, "allowed by the default (allow); no rule matches 'good.example'"),
        # most specific wins: exact beats wildcard, longer wildcard beats shorter
        (NESTED, "x.example.com", 443, False, "blocked by rule '*.example.com'"),
        (NESTED, "good.example.com", 443, True, "allowed by rule 'good.example.com'"),
        (NESTED, "img.cdn.example.com", 443, True, "allowed by rule '*.cdn.example.com'"),
        (NESTED, "bad.cdn.example.com", 443, False, "blocked by rule 'bad.cdn.example.com'"),
        (NESTED, "cdn.example.com", 443, False, "blocked by rule '*.example.com'"),
        (NESTED, "example.com", 443, True, "allowed by the default (allow); no rule matches 'example.com'"),
        # equally specific allow and block: block wins, whatever the rule order
        (TIES, "both.example", 443, False, "blocked by rule 'both.example'"),
        (TIES, "a.both.example", 443, False, "blocked by rule '*.both.example'"),
        # case-insensitive, trailing dot ignored
        (PYPI, "PyPI.ORG", 443, True, "allowed by rule 'pypi.org'"),
        (PYPI, "pypi.org.", 443, True, "allowed by rule 'pypi.org'"),
        (PYPI, "FILES.PythonHosted.Org.", 443, True, "allowed by rule '*.pythonhosted.org'"),
        # ports: a rule naming the port beats the same pattern without one; host specificity comes first
        (PORTS, "api.example", 443, True, "allowed by rule 'api.example'"),
        (PORTS, "api.example", 25, False, "blocked by rule 'api.example:25'"),
        (PORTS, "a.svc.example", 8443, True, "allowed by rule '*.svc.example:8443'"),
        (PORTS, "a.svc.example", 443, False, "blocked by rule '*.svc.example'"),
        (PORTS, "a.svc.example", None, False, "blocked by rule '*.svc.example'"),
        (PORTS, "::1", 8000, True, "allowed by rule '[::1]:8000'"),
        (PORTS, "[::1]", 8001, False, "blocked by the default (block); no rule matches '[::1]'"),
        # IP literals, IPv4-mapped IPv6, and names are distinct hosts
        (IPS, "10.0.0.1", 80, False, "blocked by rule '10.0.0.1'"),
        (IPS, "[::ffff:10.0.0.1]", 80, False, "blocked by rule '10.0.0.1'"),
        (IPS, "2001:DB8:0:0::1", 80, False, "blocked by rule '[2001:db8::1]'"),
        (IPS, "10.0.0.2", 80, True, "allowed by the default (allow); no rule matches '10.0.0.2'"),
        (IPS, "localhost", 80, False, "blocked by rule 'localhost'"),
        (IPS, "127.0.0.1", 80, True, "allowed by the default (allow); no rule matches '127.0.0.1'"),
    ],
)
def test_decide(policy: HostPolicy, host: str, port: int | None, allowed: bool, reason: str) -> None:
    assert decide(policy, host, port) == (allowed, reason)


def test_tie_goes_to_block_regardless_of_order() -> None:
    for rules in ((("x.example", "allow"), ("x.example", "block")), (("x.example", "block"), ("x.example", "allow"))):
        assert decide(_policy("allow", *rules), "x.example", 443)[0] is False


@pytest.mark.parametrize(
    "host",
    ["127.1", "0x7f.0.0.1", "2130706433", "127.000.000.001", "", "a b", "pypi.org:443", "*.x", "a..b", "ü.de", "[::1"],
)
def test_invalid_hosts_are_refused_even_under_default_allow(host: str) -> None:
    allowed, reason = decide(HostPolicy(), host, 80)
    assert allowed is False
    assert reason.startswith("invalid host:")


@pytest.mark.parametrize(
    ("pattern", "stored"),
    [
        ("pypi.org", "pypi.org"),
        ("PyPI.Org.", "pypi.org"),
        ("*.PythonHosted.org", "*.pythonhosted.org"),
        ("localhost", "localhost"),
        ("my_service.internal", "my_service.internal"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("pypi.org:443", "pypi.org:443"),
        ("*.corp.example:8080", "*.corp.example:8080"),
        ("203.0.113.7", "203.0.113.7"),
        ("203.0.113.7:8080", "203.0.113.7:8080"),
        ("[2001:DB8::0:1]", "[2001:db8::1]"),
        ("[::1]:8000", "[::1]:8000"),
        ("[::ffff:127.0.0.1]", "127.0.0.1"),
    ],
)
def test_valid_patterns_are_normalized(pattern: str, stored: str) -> None:
    assert HostRule(pattern=pattern, action="allow").pattern == stored


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("", "must not be empty"),
        ("*", "would match every host; set the policy's default"),
        ("*:443", "would match every host"),
        ("pypi .org", "must not contain whitespace"),
        (" pypi.org", "must not contain whitespace"),
        ("https://pypi.org", "is a URL; give only the host"),
        ("pypi.org/simple", "contains a path"),
        ("user@pypi.org", "contains userinfo"),
        ("a.*.example", "'*' is only allowed as the whole leftmost label"),
        ("foo*.example", "'*' is only allowed as the whole leftmost label"),
        ("*.*.example", "'*' is only allowed as the whole leftmost label"),
        ("*.0.0.1", "wildcards apply to DNS names, not IP addresses"),
        ("*.[::1]", "wildcards apply to DNS names, not IP addresses"),
        ("::1", "write IPv6 literals in brackets"),
        ("[::1", "without closing ']'"),
        ("[not-ip]", "is not a valid IPv6 address"),
        ("pypi.org:0", "invalid port"),
        ("pypi.org:70000", "invalid port"),
        ("pypi.org:https", "invalid port"),
        ("127.1", "not a canonical IPv4 address"),
        ("256.0.0.1", "not a canonical IPv4 address"),
        ("-bad.example", "invalid label '-bad'"),
        ("a..example", "invalid label ''"),
        ("bücher.example", "write internationalized names in their 'xn--' form"),
        ("a" * 64 + ".example", "invalid label"),
    ],
)
def test_invalid_patterns_are_rejected_with_a_message(pattern: str, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        HostRule(pattern=pattern, action="block")
    assert message in str(info.value)


def test_policy_rejects_unknown_fields_and_actions() -> None:
    with pytest.raises(ValidationError):
        HostPolicy.model_validate({"defualt": "block"})
    with pytest.raises(ValidationError):
        HostRule(pattern="pypi.org", action="deny")  # type: ignore[arg-type]


def test_policy_round_trips_through_json() -> None:
    policy = _policy("block", ("PyPI.org", "allow"), ("*.pythonhosted.org", "allow"))
    again = HostPolicy.model_validate_json(policy.model_dump_json())
    assert again == policy
    assert decide(again, "files.pythonhosted.org", 443)[0] is True


def test_model_copy_with_a_new_pattern_is_reparsed() -> None:
    rule = HostRule(pattern="a.example", action="block")
    other = rule.model_copy(update={"pattern": "b.example"})
    assert decide(HostPolicy(rules=[other]), "b.example")[0] is False
    assert decide(HostPolicy(rules=[other]), "a.example")[0] is True


@pytest.mark.parametrize(
    ("host", "canonical"),
    [
        ("PyPI.org.", "pypi.org"),
        ("::1", "[::1]"),
        ("[0:0::1]", "[::1]"),
        ("::ffff:10.1.2.3", "10.1.2.3"),
        ("10.1.2.3", "10.1.2.3"),
    ],
)
def test_normalize_host(host: str, canonical: str) -> None:
    assert normalize_host(host) == canonical
