"""Reading a dataset source the user named, as untrusted input (DESIGN invariant 8, issue 15).

Fetch runs on the worker, outside any sandbox, so the dataset field must not become a way to read the worker's
files or reach the platform's own network. Two kinds of source:

**http(s) URLs.** Every hop (the first request and each redirect, at most ``max_redirects``) is checked the same
way before a byte is sent:

1. the scheme is http or https; the host is a valid name or canonical IP literal (``127.1`` is refused);
2. the account's host policy allows the host (:func:`~benchwright.proxy.policy.decide`);
3. the name is resolved once, and every address it resolves to is public
   (:func:`~benchwright.proxy.addresses.internal_reason`) unless the operator listed that exact endpoint in
   ``egress_internal_allowed``;
4. the connection goes to the checked address (the URL's host is replaced by it, while the ``Host`` header and the
   TLS server name stay the original host, so certificates are still verified for that name): a second DNS
   answer cannot rebind the request to an internal address between the check and the connect.

Connect and read timeouts bound each step, ``total_timeout_s`` the whole download, and the caller bounds the size.
Environment proxies and ``.netrc`` are ignored (``trust_env=False``): the worker's own credentials never travel.

**Local paths** are read only when the deployment allows them *and* the operator flagged the account
(``benchwright accounts create NAME --local-paths``; the embedded stack's own account has it). The path is
resolved (symlinks, ``..``) and refused when it lies inside a protected place (the data directory with its API key
file and store, :data:`DENIED_PATHS`, the worker user's credential directories), outside every configured root
(``dataset_roots``), or is not a regular file. It is then opened one component at a time with ``O_NOFOLLOW`` from
``/``, so a symlink swapped in after the check cannot redirect the read.

Every refusal raises :class:`~benchwright.errors.DatasetError` with code ``dataset_blocked`` (permanent: Fetch is
not retried), and a refused *host* is reported through ``on_refused`` for the run's blocked-host log.
"""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from benchwright.errors import DatasetError, InvalidInput
from benchwright.proxy.addresses import Endpoint, endpoint_allowed, first_internal
from benchwright.proxy.policy import HostPolicy, decide, normalize_host

if TYPE_CHECKING:
    from benchwright.settings import Settings

__all__ = ["DENIED_PATHS", "DatasetAccess", "LocalPathRules", "check_local_path", "is_url", "open_source"]

BLOCKED = "dataset_blocked"
"""Error code of every refusal, at launch (400) and at Fetch (PhaseFailed)."""

DENIED_PATHS: tuple[str, ...] = (
    "/proc", "/sys", "/dev", "/run/secrets", "/var/run/secrets", "/etc/shadow", "/etc/shadow-", "/etc/gshadow",
    "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d", "/etc/ssh", "/etc/ssl/private",
)
"""Places that hold secrets or are not files at all, refused whatever the roots say."""

_HOME_SECRETS = (".ssh", ".aws", ".azure", ".config/gcloud", ".kube", ".docker", ".gnupg", ".netrc", ".pgpass",
                 ".git-credentials", ".benchwright")
"""Credential files and directories in the worker user's home and root's (and the default data directory)."""

_CHUNK = 1 << 16


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


@dataclass(frozen=True)
class LocalPathRules:
    """Whether and where a launch may name a file on the worker's host."""

    deployment: bool = False
    """The deployment reads local paths at all (``allow_local_paths``)."""
    account: bool = False
    """The operator flagged the launching account (``accounts.local_paths``)."""
    protected: tuple[Path, ...] = ()
    """Places of this deployment that hold secrets (the data directory, the store's file), besides the defaults."""
    roots: tuple[Path, ...] = ()
    """When not empty, datasets must lie under one of these directories (``dataset_roots``)."""

    @classmethod
    def from_settings(cls, settings: Settings, *, account_local_paths: bool) -> LocalPathRules:
        """The deployment's rules for an account with or without the flag (the API and Fetch build the same)."""
        protected = [settings.data_dir]
        url = settings.resolved_database_url()
        if url.startswith("sqlite:///"):
            protected.append(Path(url.removeprefix("sqlite:///")))
        # the deployment key (benchwright.security.crypto), wherever it lives
        if settings.deployment_key_file is not None:
            protected.append(settings.deployment_key_file)
        return cls(deployment=settings.allow_local_paths, account=account_local_paths, protected=tuple(protected),
                   roots=tuple(settings.dataset_roots))


@dataclass(frozen=True)
class DatasetAccess:
    """Everything one run's Fetch may reach: the account's policy, the operator's endpoints, the path rules."""

    policy: HostPolicy = field(default_factory=HostPolicy)
    internal_allowed: frozenset[Endpoint] = frozenset()
    local: LocalPathRules = field(default_factory=LocalPathRules)
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 30.0
    """Longest wait for the next bytes (also bounds one DNS-free connect + TLS handshake together with connect)."""
    total_timeout_s: float = 600.0
    max_redirects: int = 5


def _refused(message: str) -> DatasetError:
    return DatasetError(message, code=BLOCKED)


# ---------------------------------------------------------------------------------------------------- local paths


def _inside(path: Path, place: Path) -> bool:
    return path == place or place in path.parents


def _denied_places(rules: LocalPathRules) -> list[Path]:
    homes = {Path.home(), Path("/root")}
    places = [Path(p) for p in DENIED_PATHS] + [h / p for h in homes for p in _HOME_SECRETS] + list(rules.protected)
    return [p.resolve() for p in places]


def check_local_path(source: str, rules: LocalPathRules, *, must_exist: bool) -> Path:
    """The resolved path of a local dataset, if the rules allow reading it.

    Args:
        source: The launch's ``dataset`` (not a URL).
        rules: The deployment's and the account's rules.
        must_exist: Also require an existing regular file (Fetch). The API checks the rest at launch without it,
            since the API and the worker need not share a file system.

    Raises:
        InvalidInput: local paths are off for the deployment or the account (code ``local_paths_disabled``).
        DatasetError: the path lies in a protected place or outside the roots, or is not a regular file
            (``dataset_blocked``); it does not exist (``fetch_failed``).
    """
    if not rules.deployment:
        raise InvalidInput("this deployment does not read datasets from local paths; give an http(s) URL",
                           code="local_paths_disabled")
    if not rules.account:
        raise InvalidInput("this account may not read datasets from local paths on the worker (the operator grants "
                           "it with 'benchwright accounts create NAME --local-paths'); give an http(s) URL",
                           code="local_paths_disabled")
    path = Path(source).expanduser()
    try:
        resolved = path.resolve(strict=must_exist)
    except FileNotFoundError:
        raise DatasetError(f"no dataset file at {source}", code="fetch_failed") from None
    except (OSError, RuntimeError) as exc:  # a symlink loop, a permission error on a component
        raise _refused(f"cannot resolve dataset path {source}: {exc}") from None
    for place in _denied_places(rules):
        if _inside(resolved, place):
            raise _refused(f"dataset path {source} resolves to {resolved}, inside {place}, which holds the "
                           "platform's or the host's secrets; datasets are never read from there")
    roots = [r.expanduser().resolve() for r in rules.roots]
    if roots and not any(_inside(resolved, root) for root in roots):
        raise _refused(f"dataset path {source} resolves to {resolved}, outside the allowed dataset roots "
                       f"({', '.join(map(str, roots))})")
    if must_exist and not resolved.is_file():
        raise _refused(f"dataset path {source} is not a regular file")
    return resolved


def _open_no_follow(resolved: Path) -> int:
    """Open an absolute, already resolved path one component at a time, never following a symlink.

    Raises:
        DatasetError: a component is now a symlink or missing (the path changed after the check), or the file is
            not a regular file.
    """
    dir_flags = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW
    fd = os.open("/", dir_flags)
    try:
        for part in resolved.parts[1:-1]:
            nxt = os.open(part, dir_flags, dir_fd=fd)
            os.close(fd)
            fd = nxt
        # O_NONBLOCK: a FIFO swapped in must not hang the worker on open.
        file_fd = os.open(resolved.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=fd)
    except OSError as exc:
        raise _refused(f"dataset path {resolved} changed while it was being opened ({exc.strerror})") from None
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(file_fd).st_mode):
        os.close(file_fd)
        raise _refused(f"dataset path {resolved} is not a regular file")
    return file_fd


def _file_chunks(resolved: Path) -> Iterator[bytes]:
    fd = _open_no_follow(resolved)
    try:
        while chunk := os.read(fd, _CHUNK):
            yield chunk
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------------------------ URLs


def _check_hop(url: httpx.URL, access: DatasetAccess, on_refused: Callable[[str], None]) -> str:
    """Apply scheme, host-policy and internal-address checks to one hop; returns the address to connect to."""
    if url.scheme not in ("http", "https"):
        raise _refused(f"dataset URL {url} uses scheme {url.scheme!r}; only http and https are fetched")
    try:
        host = normalize_host(url.host)
    except ValueError as exc:
        on_refused(url.host or "(empty host)")
        raise _refused(f"dataset URL {url} has an invalid host: {exc}") from None
    port = url.port or (443 if url.scheme == "https" else 80)
    allowed, reason = decide(access.policy, host, port)
    if not allowed:
        on_refused(host)
        raise _refused(f"fetching the dataset from {host} was refused: {host} is blocked by the account's host "
                       f"policy ({reason})")
    bare = host[1:-1] if host.startswith("[") else host
    try:
        infos = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise DatasetError(f"the dataset host {host} does not resolve ({exc.strerror})", code="fetch_failed") from None
    address = str(infos[0][4][0])
    if endpoint_allowed(access.internal_allowed, host=bare, address=address, port=port):
        return address
    inside = first_internal(infos)
    if inside is not None:
        on_refused(host)
        raise _refused(f"fetching the dataset from {host} was refused: it resolves to an internal address "
                       f"({inside[0]}: {inside[1]}); datasets are never fetched from the platform's own network")
    return address


def _url_chunks(source: str, access: DatasetAccess, on_refused: Callable[[str], None]) -> Iterator[bytes]:
    deadline = time.monotonic() + access.total_timeout_s
    timeout = httpx.Timeout(access.read_timeout_s, connect=access.connect_timeout_s)
    url = httpx.URL(source)
    with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        for _hop in range(access.max_redirects + 1):
            address = _check_hop(url, access, on_refused)
            pinned = url.copy_with(host=address, fragment=None)
            request = client.build_request("GET", pinned, headers={"Host": url.netloc.decode("ascii")},
                                           extensions={"sni_hostname": url.host})
            resp = client.send(request, stream=True)
            try:
                if resp.is_redirect:
                    url = url.join(resp.headers["location"])
                    continue
                if resp.status_code >= 400:
                    raise DatasetError(f"fetching {source} answered HTTP {resp.status_code}", code="fetch_failed")
                for chunk in resp.iter_bytes():
                    if time.monotonic() > deadline:
                        raise DatasetError(f"fetching {source} took longer than {access.total_timeout_s:.0f} s",
                                           code="fetch_timeout")
                    yield chunk
                return
            finally:
                resp.close()
    raise _refused(f"fetching {source} was refused: more than {access.max_redirects} redirects")


def open_source(source: str, access: DatasetAccess,
                on_refused: Callable[[str], None] = lambda host: None) -> Iterator[bytes]:
    """The dataset's bytes, from a URL or a local path, under the rules in the module docstring.

    Args:
        source: The launch's ``dataset``.
        access: What this run may reach.
        on_refused: Called with the canonical host of every refused URL hop, before the error is raised (the
            run's blocked-host log).

    Raises:
        DatasetError: a refusal (``dataset_blocked``), an error status or a missing file (``fetch_failed``), or the
            total time bound (``fetch_timeout``).
        InvalidInput: local paths are off for the deployment or the account.
        httpx.TransportError: a network fault (transient: the caller retries).
    """
    if is_url(source):
        yield from _url_chunks(source, access, on_refused)
        return
    if "://" in source:
        raise DatasetError(f"unsupported dataset scheme in {source!r}: use http(s) or a local path")
    yield from _file_chunks(check_local_path(source, access.local, must_exist=True))
