"""The local backend's content-addressed snapshot store (see ``local``'s module docstring, **Snapshots**)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from benchwright.sandbox.base import (
    SandboxError,
    SandboxPathError,
)
from benchwright.sandbox.local_util import _open_parent, _split_relpath, _write_json_atomic

_SNAPSHOT_FORMAT = "benchwright-snapshot/1"

# ---------------------------------------------------------------------------------------------------- snapshots ---


def _write_file_into(work: Path, parts: list[str], data: bytes, *, mode: int, uid: int | None,
                     gid: int | None) -> None:
    """Write a regular file at ``parts`` under ``work`` (parents created), never through a symlink."""
    dfd = _open_parent(work, parts, create=True, uid=uid, gid=gid)
    try:
        try:
            fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (40, 21):  # ELOOP, EISDIR
                raise SandboxPathError(f"{'/'.join(parts)!r} is a symlink or a directory") from exc
            raise
    finally:
        os.close(dfd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SandboxPathError(f"{'/'.join(parts)!r} is not a regular file")
        _write_all(fd, data)
        if uid is not None:
            os.fchown(fd, uid, gid or uid)
        os.fchmod(fd, mode & 0o777)
    finally:
        os.close(fd)


class _SnapshotStore:
    """Content-addressed snapshots of work directories (see the module docstring for the layout)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.objects = root / "objects"
        self.manifests = root / "manifests"
        self.labels = root / "labels"
        for d in (root, self.objects, self.manifests, self.labels, self.objects / "tmp"):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.restored: dict[str, dict[str, tuple[int, int, int, int, int, str]]] = {}
        """work dir -> relative path -> (st_dev, st_ino, size, mtime_ns, ctime_ns, sha256) as restore left it."""

    def object_path(self, digest: str) -> Path:
        return self.objects / digest[:2] / digest[2:]

    def _store(self, fd: int) -> tuple[str, int]:
        """Copy an open file into the store while hashing it (what is stored is exactly what was hashed)."""
        h = hashlib.sha256()
        size = 0
        tmp_fd, tmp = tempfile.mkstemp(dir=self.objects / "tmp")
        try:
            with os.fdopen(tmp_fd, "wb") as out:
                while chunk := os.read(fd, 1 << 20):
                    h.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
            digest = h.hexdigest()
            dest = self.object_path(digest)
            if dest.exists():
                os.unlink(tmp)  # identical content is stored once
            else:
                dest.parent.mkdir(mode=0o700, exist_ok=True)
                os.chmod(tmp, 0o400)
                os.replace(tmp, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return digest, size

    def capture(self, work: Path, *, label: str, source: str) -> str:
        files: dict[str, dict[str, Any]] = {}
        dirs: dict[str, dict[str, int]] = {}
        links: dict[str, str] = {}

        def walk(dfd: int, prefix: str) -> None:
            for name in sorted(os.listdir(dfd)):
                rel = prefix + name
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
                    try:
                        dirs[rel] = {"mode": stat.S_IMODE(st.st_mode) & 0o777}
                        walk(sub, rel + "/")
                    finally:
                        os.close(sub)
                elif stat.S_ISREG(st.st_mode):
                    # O_NONBLOCK: if it was swapped for a FIFO meanwhile, open must not hang; fstat rejects it.
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dfd)
                    try:
                        st = os.fstat(fd)
                        if not stat.S_ISREG(st.st_mode):
                            continue
                        was = restored.get(rel)
                        if was is not None and was[:5] == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                                           st.st_ctime_ns) and self.object_path(was[5]).is_file():
                            digest, size = was[5], st.st_size  # untouched since restore: its object is stored
                        else:
                            digest, size = self._store(fd)
                    finally:
                        os.close(fd)
                    files[rel] = {"sha256": digest, "size": size, "mode": stat.S_IMODE(st.st_mode) & 0o777}
                elif stat.S_ISLNK(st.st_mode):
                    links[rel] = os.readlink(name, dir_fd=dfd)
                # FIFOs, sockets and device nodes are not content: skipped.

        restored = self.restored.get(str(work), {})
        top = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            walk(top, "")
        finally:
            os.close(top)
        manifest = {"format": _SNAPSHOT_FORMAT, "files": files, "dirs": dirs, "symlinks": links}
        raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        snapshot_id = hashlib.sha256(raw).hexdigest()
        path = self.manifests / f"{snapshot_id}.json"
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
            tmp.write_bytes(raw)
            os.replace(tmp, path)
        label_path = self.labels / f"{snapshot_id}.json"
        try:
            entries = json.loads(label_path.read_text())
        except (OSError, ValueError):
            entries = []
        entries.append({"label": label, "source": source, "created_at": time.time()})
        _write_json_atomic(label_path, entries)
        return snapshot_id

    def load(self, snapshot_id: str) -> dict[str, Any]:
        if not isinstance(snapshot_id, str) or len(snapshot_id) != 64 or not all(
                c in "0123456789abcdef" for c in snapshot_id):
            raise SandboxError(f"invalid snapshot id {snapshot_id!r}")
        try:
            raw = (self.manifests / f"{snapshot_id}.json").read_bytes()
        except FileNotFoundError:
            raise SandboxError(f"unknown snapshot {snapshot_id}") from None
        if hashlib.sha256(raw).hexdigest() != snapshot_id:
            raise SandboxError(f"snapshot {snapshot_id} is damaged (its manifest does not match its id)")
        manifest: dict[str, Any] = json.loads(raw)
        if manifest.get("format") != _SNAPSHOT_FORMAT:
            raise SandboxError(f"snapshot {snapshot_id} has unknown format {manifest.get('format')!r}")
        return manifest

    def restore(self, snapshot_id: str, work: Path, *, uid: int | None, gid: int | None) -> None:
        manifest = self.load(snapshot_id)
        owner = (uid, gid if gid is not None else uid) if uid is not None else None
        stamps: dict[str, tuple[int, int, int, int, int, str]] = {}
        for rel in sorted(manifest["dirs"], key=lambda p: p.count("/")):
            parts = _split_relpath(rel)
            dfd = _open_parent(work, parts, create=True, uid=uid, gid=gid)
            try:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(parts[-1], 0o700, dir_fd=dfd)
                if owner:
                    os.chown(parts[-1], *owner, dir_fd=dfd, follow_symlinks=False)
            finally:
                os.close(dfd)
        for rel, entry in manifest["files"].items():
            parts = _split_relpath(rel)
            dfd = _open_parent(work, parts, create=True, uid=uid, gid=gid)
            try:
                fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
            finally:
                os.close(dfd)
            try:
                h = hashlib.sha256()
                try:
                    src = open(self.object_path(entry["sha256"]), "rb")  # noqa: SIM115
                except FileNotFoundError:
                    raise SandboxError(f"snapshot {snapshot_id} is damaged: object of {rel!r} is missing") from None
                with src:
                    while chunk := src.read(1 << 20):
                        h.update(chunk)
                        _write_all(fd, chunk)
                if h.hexdigest() != entry["sha256"]:
                    raise SandboxError(f"snapshot {snapshot_id} is damaged: object of {rel!r} does not match")
                if owner:
                    os.fchown(fd, *owner)
                os.fchmod(fd, int(entry["mode"]) & 0o777)
                st = os.fstat(fd)
                stamps[rel] = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, entry["sha256"])
            finally:
                os.close(fd)
        for rel, target in manifest["symlinks"].items():
            parts = _split_relpath(rel)
            dfd = _open_parent(work, parts, create=True, uid=uid, gid=gid)
            try:
                os.symlink(target, parts[-1], dir_fd=dfd)
                if owner:
                    os.chown(parts[-1], *owner, dir_fd=dfd, follow_symlinks=False)
            finally:
                os.close(dfd)
        for rel, entry in manifest["dirs"].items():  # modes last: a read-only dir must not block its own restore
            parts = _split_relpath(rel)
            dfd = _open_parent(work, parts, create=False, uid=uid, gid=gid)
            try:
                os.chmod(parts[-1], int(entry["mode"]) & 0o777, dir_fd=dfd, follow_symlinks=False)
            finally:
                os.close(dfd)
        if stamps:
            _outlast_tick(self.objects / "tmp", max(stamp[4] for stamp in stamps.values()))
            self.restored[str(work)] = stamps

    def forget(self, work: Path) -> None:
        """Drop what restore noted about ``work`` (the sandbox or staging directory is going away)."""
        self.restored.pop(str(work), None)


def _outlast_tick(probe_dir: Path, newest_ns: int) -> None:
    """Return once the file clock (the kernel's coarse clock: 1-4 ms ticks) has passed ``newest_ns``, so that any
    change to a restored file from now on gives it a later ctime than restore saw (the "racy git" problem). Read on
    a probe file in ``probe_dir``; bounded at 50 ms."""
    fd, probe = tempfile.mkstemp(dir=probe_dir)
    try:
        deadline = time.monotonic() + 0.05
        while time.monotonic() < deadline:
            os.fchmod(fd, 0o600)  # a metadata change: stamps ctime with the clock's current tick
            if os.fstat(fd).st_ctime_ns > newest_ns:
                return
            time.sleep(0.0005)
    finally:
        os.close(fd)
        os.unlink(probe)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
