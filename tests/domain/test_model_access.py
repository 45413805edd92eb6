"""The model endpoint check (benchwright.llm.model_access): a launch's api_base is a place a user names."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from benchwright.llm.model_access import ModelAccess, ModelEndpointRefused, check_api_base
from benchwright.proxy.addresses import parse_endpoints
from benchwright.proxy.policy import HostPolicy, HostRule

OPEN = ModelAccess(policy=HostPolicy())


def _refused(api_base: str, access: ModelAccess = OPEN, **kwargs: Any) -> tuple[str, list[str]]:
    blocked: list[str] = []
    with pytest.raises(ModelEndpointRefused) as caught:
        check_api_base(api_base, access, on_refused=blocked.append, **kwargs)
    return str(caught.value), blocked


@pytest.mark.parametrize(("api_base", "why"), [
    ("http://169.254.169.254/latest/meta-data/?x=", "169.254.169.254: link-local"),  # the cloud metadata address
    ("http://127.0.0.1:8000/v1", "127.0.0.1: loopback"),
    ("http://localhost:8000/v1", "loopback"),  # a name that resolves inside
    ("http://10.1.2.3/v1", "10.1.2.3: private"),
    ("http://[::ffff:127.0.0.1]:9/v1", "127.0.0.1: loopback"),  # canonicalized to the IPv4 it embeds
    ("http://[::1]:9/v1", "::1: loopback"),
])
def test_internal_model_endpoints_are_refused_and_logged(api_base: str, why: str) -> None:
    message, blocked = _refused(api_base)
    assert "resolves to an internal address" in message and why in message, message
    assert "BENCHWRIGHT_MODEL_INTERNAL_ALLOWED" in message, "says what an operator can do"
    assert len(blocked) == 1


def test_a_name_rebound_to_an_internal_address_is_refused() -> None:
    def resolver(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        assert host == "models.example.com"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))]

    message, blocked = _refused("https://models.example.com/v1", resolve=resolver)
    assert "169.254.169.254: link-local" in message and blocked == ["models.example.com"]


def test_public_endpoints_pass_with_the_address_to_connect_to() -> None:
    def resolver(host: str, port: int, **_: Any) -> list[tuple[Any, ...]]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port))]

    assert check_api_base("https://models.example.com/v1", OPEN, resolve=resolver) == "93.184.216.34"
    assert check_api_base("http://8.8.8.8:8080/v1", OPEN) == "8.8.8.8"


def test_the_accounts_host_policy_applies() -> None:
    policy = HostPolicy(default="block", rules=[HostRule(pattern="*.openai.example", action="allow")])
    message, blocked = _refused("https://models.example.com/v1", ModelAccess(policy=policy))
    assert "blocked by the account's host policy" in message and blocked == ["models.example.com"]
    ok = check_api_base("https://api.openai.example/v1", ModelAccess(policy=policy),
                        resolve=lambda h, p, **_: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", p))])
    assert ok == "93.184.216.34"


def test_operator_listed_endpoints_and_trusted_accounts_may_name_internal_models() -> None:
    listed = ModelAccess(policy=HostPolicy(), internal_allowed=parse_endpoints(["127.0.0.1:8000"]))
    assert check_api_base("http://127.0.0.1:8000/v1", listed) == "127.0.0.1"
    _refused("http://127.0.0.1:8001/v1", listed)  # only that exact endpoint
    trusted = ModelAccess(policy=HostPolicy(), trusted_local=True)
    assert check_api_base("http://127.0.0.1:8001/v1", trusted) == "127.0.0.1"
    # the host policy still applies to a trusted account
    blocking = ModelAccess(policy=HostPolicy(default="block"), trusted_local=True)
    assert "host policy" in _refused("http://127.0.0.1:8001/v1", blocking)[0]


@pytest.mark.parametrize("api_base", ["ftp://example.com/v1", "file:///etc/passwd", "http://exa mple.com/v1",
                                      "http://example.com:99999/v1"])
def test_malformed_endpoints_are_refused_naming_the_problem(api_base: str) -> None:
    message, _ = _refused(api_base)
    assert api_base.split("/")[0].rstrip(":") in message or "api_base" in message


def test_an_unresolvable_host_is_left_to_fail_as_unreachable() -> None:
    assert check_api_base("http://no-such-host.invalid/v1", OPEN) is None
