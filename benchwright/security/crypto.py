"""The deployment key: AES-256-GCM for what must not rest in clear (provider secrets in the store, Temporal payloads).

Scheme: AES-GCM directly under the deployment key, a fresh 96-bit nonce per value, the key's id stored beside the
ciphertext (``key_id``: the first 16 hex of a sha256 of the key, so it names a key without revealing it) and the
owner of the value as associated data (a secret's row id), so a ciphertext copied onto another row does not decrypt.
No per-row data key: there is one deployment key at a time and rotation re-encrypts every row anyway (the store
holds few, small secrets), so a wrapped data key would add a second decryption and no protection.

Where the key comes from, first match wins (never from the store):
1. ``BENCHWRIGHT_DEPLOYMENT_KEY``: base64 of 32 bytes; several comma-separated keys during a rotation, the first
   encrypts and all of them decrypt.
2. ``BENCHWRIGHT_DEPLOYMENT_KEY_FILE``: a file of such keys, one a line, the first encrypts (``#`` comments allowed).
3. ``<data dir>/deployment.key``, the file ``benchwright up`` creates (mode 0600) on first start.

A file is re-read when it changes, so ``benchwright keys rotate`` reaches running processes without a restart.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from benchwright.errors import InvalidInput, Unavailable

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from benchwright.settings import Settings

KEY_BYTES = 32
NONCE_BYTES = 12
KEY_FILE_NAME = "deployment.key"
KEY_ENV = "BENCHWRIGHT_DEPLOYMENT_KEY"
KEY_FILE_ENV = "BENCHWRIGHT_DEPLOYMENT_KEY_FILE"
MAX_KEY_FILE_BYTES = 64 * 1024


class DeploymentKeyError(Unavailable):
    """A deployment key is missing, malformed, or not the one a value was encrypted under."""

    code = "deployment_key"


class DecryptionFailed(InvalidInput):
    """A ciphertext does not authenticate under its key (tampered, or moved to another row)."""

    code = "decryption_failed"


def key_id(key: bytes) -> str:
    return hashlib.sha256(b"benchwright-deployment-key:" + key).hexdigest()[:16]


def generate_key() -> str:
    """A fresh deployment key, base64."""
    return base64.b64encode(os.urandom(KEY_BYTES)).decode()


def parse_keys(text: str, *, where: str) -> list[bytes]:
    """Keys from ``text`` (comma, space or newline separated base64; ``#`` starts a comment line).

    Raises:
        DeploymentKeyError: a key is not base64 of exactly 32 bytes, or there is none.
    """
    keys: list[bytes] = []
    for line in text.splitlines():
        if line.strip().startswith("#"):
            continue
        for token in line.replace(",", " ").split():
            try:
                key = base64.b64decode(token + "=" * (-len(token) % 4), altchars=b"-_" if "-" in token or "_" in
                                       token else None, validate=True)
            except (binascii.Error, ValueError):
                raise DeploymentKeyError(f"a deployment key in {where} is not base64") from None
            if len(key) != KEY_BYTES:
                raise DeploymentKeyError(f"a deployment key in {where} is {len(key)} bytes; it must be {KEY_BYTES} "
                                "(make one with `benchwright keys generate`)")
            if key not in keys:
                keys.append(key)
    if not keys:
        raise DeploymentKeyError(f"{where} holds no deployment key")
    return keys


class Keyring:
    """The deployment keys a process holds: the first (primary) encrypts, every one decrypts."""

    def __init__(self, keys: list[bytes], *, source: str, path: Path | None = None) -> None:
        self.source = source
        """Where the keys came from (for messages): the environment variable or the file's path."""
        self.path = path
        self._lock = threading.Lock()
        self._stamp = self._file_stamp()
        self._set(keys)

    def _set(self, keys: list[bytes]) -> None:
        self._keys = {key_id(k): k for k in keys}
        self._ciphers = {key_id(k): AESGCM(k) for k in keys}
        self._primary = key_id(keys[0])

    def _file_stamp(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def refresh(self) -> None:
        """Re-read the key file if it changed since it was read (a rotation under way)."""
        if self.path is None:
            return
        stamp = self._file_stamp()
        if stamp == self._stamp or stamp is None:
            return
        with self._lock:
            if stamp != self._stamp:
                self._set(read_key_file(self.path))
                self._stamp = stamp

    @property
    def primary_id(self) -> str:
        self.refresh()
        return self._primary

    @property
    def ids(self) -> list[str]:
        self.refresh()
        return list(self._ciphers)

    def derive(self, kid: str, label: bytes) -> str:
        """HMAC-SHA256 of ``label`` under key ``kid`` (hex): a token that proves the key without revealing it."""
        return hmac.new(self._keys[kid], label, hashlib.sha256).hexdigest()

    def encrypt(self, plaintext: bytes, *, aad: bytes) -> tuple[str, bytes]:
        """``(key id, nonce + ciphertext)`` under the primary key."""
        self.refresh()
        kid = self._primary
        nonce = os.urandom(NONCE_BYTES)
        return kid, nonce + self._ciphers[kid].encrypt(nonce, plaintext, aad)

    def decrypt(self, kid: str, blob: bytes, *, aad: bytes) -> bytes:
        """
        Raises:
            DeploymentKeyError: ``kid`` is not one of this process's keys.
            DecryptionFailed: the ciphertext does not authenticate.
        """
        cipher = self._ciphers.get(kid)
        if cipher is None:
            self.refresh()
            cipher = self._ciphers.get(kid)
        if cipher is None:
            raise DeploymentKeyError(
                f"a value is encrypted under deployment key {kid}, which is not among the keys this process holds "
                f"({', '.join(self._ciphers)} from {self.source}); keep the old key listed until `benchwright keys "
                "rotate` has finished", code="unknown_deployment_key")
        try:
            return cipher.decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], aad)
        except InvalidTag:
            raise DecryptionFailed(f"a value encrypted under key {kid} does not authenticate (tampered or moved)"
                                   ) from None


def read_key_file(path: Path) -> list[bytes]:
    try:
        if path.stat().st_size > MAX_KEY_FILE_BYTES:
            raise DeploymentKeyError(f"deployment key file {path} is larger than {MAX_KEY_FILE_BYTES} bytes")
        text = path.read_text()
    except OSError as exc:
        raise DeploymentKeyError(f"cannot read the deployment key file {path}: {exc.strerror or exc}") from None
    return parse_keys(text, where=str(path))


def key_file_of(settings: Settings) -> Path | None:
    """The key file this deployment reads (explicit, else the data directory's if it exists); None for env keys."""
    if settings.deployment_key is not None:
        return None
    if settings.deployment_key_file is not None:
        return settings.deployment_key_file
    default = settings.data_dir / KEY_FILE_NAME
    return default if default.exists() else None


def load_keyring(settings: Settings) -> Keyring | None:
    """The deployment's keys, or None when none is configured.

    Raises:
        DeploymentKeyError: a configured key is malformed or its file unreadable.
    """
    if settings.deployment_key is not None:
        return Keyring(parse_keys(settings.deployment_key.get_secret_value(), where=KEY_ENV), source=KEY_ENV)
    path = key_file_of(settings)
    if path is None:
        return None
    return Keyring(read_key_file(path), source=str(path), path=path)


def ensure_key_file(data_dir: Path) -> Path:
    """``<data_dir>/deployment.key``, created (mode 0600, never readable by others) if it does not exist."""
    path = data_dir / KEY_FILE_NAME
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(fd, "w") as out:
        out.write(f"# Benchwright deployment key ({key_id(base64.b64decode(key := generate_key()))}); first line "
                  "encrypts. Keep a copy: without it the stored secrets and Temporal payloads cannot be read.\n"
                  f"{key}\n")
    return path


def write_key_file(path: Path, keys: list[bytes]) -> None:
    """Replace the key file atomically (0600) with ``keys``, the first encrypting."""
    lines = ["# Benchwright deployment keys: the first encrypts, all decrypt (benchwright keys list)."]
    lines += [base64.b64encode(k).decode() for k in keys]
    tmp = path.with_name(path.name + ".part")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(lines) + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


_bound: weakref.WeakKeyDictionary[Engine, Keyring | None] = weakref.WeakKeyDictionary()


def bind(engine: Engine, keyring: Keyring | None) -> None:
    """Make ``keyring`` the one the store code uses for ``engine`` (set where the engine is opened)."""
    _bound[engine] = keyring


def keyring_of(engine: Engine) -> Keyring | None:
    return _bound.get(engine)
