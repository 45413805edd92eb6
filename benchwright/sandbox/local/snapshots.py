"""The local backend's content-addressed snapshot store (see ``local``'s module docstring, **Snapshots**)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from benchwright.data.digests import file_digests
from benchwright.sandbox.base import (
    SandboxError,
    SandboxPathError,
)
from benchwright.sandbox.local.util import _open_parent, _split_relpath

_SNAPSHOT_FORMAT = "benchwright-snapshot/1"
LINK_MIN_BYTES = 1 << 20
"""Files from this size on are restored into sandboxes as hard links to their stored object (``restore(link=True)``).
Measured on the re-run bench: a 52 MB dataset took ~0.25 s to copy and verify into each sandbox, ~0.1 ms to link."""
_LINKED_MODE = 0o444
"""A linked object's mode: readable by the sandbox's uid, writable by nobody but root (the inode's owner)."""
_WRITE_RETRIES = 8

# ---------------------------------------------------------------------------------------------------- snapshots ---


def _write_file_into(work: Path, parts: list[str], data: bytes, *, mode: int, uid: int | None,
                     gid: int | None) -> None:
    """Write a regular file at ``parts`` under ``work`` (parents created), never through a symlink."""
    dfd = _open_parent(work, parts, create=True, uid=uid, gid=gid)
    try:
        fd = _open_unshared(dfd, parts)
    finally:
        os.close(dfd)
    try:
        os.ftruncate(fd, 0)
        _write_all(fd, data)
        if uid is not None:
            os.fchown(fd, uid, gid or uid)
        os.fchmod(fd, mode & 0o777)
    finally:
        os.close(fd)


def _open_unshared(dfd: int, parts: list[str]) -> int:
    """Open ``parts[-1]`` in ``dfd`` for writing (created if missing, not truncated), as a regular file that no
    other name shares: an existing file with more than one link (a restored snapshot object, or anything a sandbox
    linked) is unlinked and a new one made, because the writer is root and would otherwise write the shared inode
    (the object store itself). Checked on the open descriptor, so a swap of the name in between cannot slip one by.

    Raises:
        SandboxPathError: the name is a symlink, a directory or not a regular file, or keeps being swapped for a
            shared file.
    """
    where = "/".join(parts)
    for _ in range(_WRITE_RETRIES):
        try:
            fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600, dir_fd=dfd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR):
                raise SandboxPathError(f"{where!r} is a symlink or a directory") from exc
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise SandboxPathError(f"{where!r} is not a regular file")
        if st.st_nlink <= 1:
            return fd
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(parts[-1], dir_fd=dfd)
    raise SandboxPathError(f"{where!r} kept being replaced by a file with other links; not written")


def settle_object(tmp: str, dest: Path, digest: str) -> None:
    """Put the staged file ``tmp`` (whose sha256 is ``digest``) into an object store at ``dest``, read-only (0400);
    identical content is stored once, so an existing object wins and ``tmp`` goes. Shared by the snapshot store and
    the registry's blobs, which keep their objects in the same directory."""
    if dest.exists():
        os.unlink(tmp)
        return
    dest.parent.mkdir(mode=0o700, exist_ok=True)
    os.chmod(tmp, 0o400)
    os.replace(tmp, dest)
    file_digests.note(dest, digest)  # what was hashed is what is stored


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
        """work dir -> relative path -> (st_dev, st_ino, size, mtime_ns, ctime_ns, sha256) of the files restore
        copied, as it left them."""
        self.linked: dict[str, dict[str | tuple[int, int], tuple[int, int, str, int]]] = {}
        """work dir -> relative path, and (st_dev, st_ino) -> (st_dev, st_ino, sha256, manifest mode) of the files
        restore linked to their object."""

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
            settle_object(tmp, self.object_path(digest), digest)
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
                        mode = stat.S_IMODE(st.st_mode) & 0o777
                        was = restored.get(rel)
                        link = linked.get(rel) or linked.get((st.st_dev, st.st_ino))
                        if link is not None and link[:2] == (st.st_dev, st.st_ino) and self._is_object(link[2], st):
                            # Still the stored object's own inode, which the sandbox cannot write: its digest, and
                            # the mode the manifest gave it (a link shows 0444 whatever it was).
                            digest, size, mode = link[2], st.st_size, link[3]
                        elif was is not None and was[:5] == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                                             st.st_ctime_ns) and self.object_path(was[5]).is_file():
                            digest, size = was[5], st.st_size  # untouched since restore: its object is stored
                        else:
                            digest, size = self._store(fd)
                    finally:
                        os.close(fd)
                    files[rel] = {"sha256": digest, "size": size, "mode": mode}
                elif stat.S_ISLNK(st.st_mode):
                    links[rel] = os.readlink(name, dir_fd=dfd)
                # FIFOs, sockets and device nodes are not content: skipped.

        restored = self.restored.get(str(work), {})
        linked = self.linked.get(str(work), {})
        top = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            walk(top, "")
        finally:
            os.close(top)
        return self._record({"format": _SNAPSHOT_FORMAT, "files": files, "dirs": dirs, "symlinks": links},
                            label=label, source=source)

    def layer(self, base: str | None, files: dict[str, bytes], *, label: str, source: str) -> str | None:
        """The snapshot ``base`` (None: an empty directory) plus ``files`` (mode 0644), made from the manifests alone:
        the snapshot that restoring ``base``, writing each file and capturing would give (same entries, so the same
        id), without copying and hashing ``base``'s files again (a 52 MB dataset took ~0.1 s through a staging
        directory) or making a staging directory at all.

        Only where the outcome is plain: every file lands in the top directory or in a directory ``base`` has, no
        component is one of ``base``'s files or symlinks, and no file replaces a directory or a symlink. Anything
        else returns None, and the caller goes through a staging directory, which raises as a sandbox would.

        Raises:
            SandboxPathError: a path would leave the work directory.
            SandboxError: ``base`` is unknown or damaged (a missing object, or one whose bytes do not match).
        """
        manifest = self.load(base) if base is not None else {"files": {}, "dirs": {}, "symlinks": {}}
        entries: dict[str, Any] = dict(manifest["files"])
        dirs, links = manifest["dirs"], manifest["symlinks"]
        written: dict[str, bytes] = {}
        for path, data in files.items():
            parts = _split_relpath(path)
            rel = "/".join(parts)
            parents = ["/".join(parts[:i]) for i in range(1, len(parts))]
            if rel in dirs or rel in links or any(p not in dirs for p in parents):
                return None
            written[rel] = data
        for rel, entry in entries.items():  # what restore would have checked of each object
            obj = self.object_path(entry["sha256"])
            try:
                size = os.stat(obj).st_size
            except FileNotFoundError:
                raise SandboxError(f"snapshot {base} is damaged: object of {rel!r} is missing") from None
            if size != entry["size"] or file_digests.sha256(obj) != entry["sha256"]:
                raise SandboxError(f"snapshot {base} is damaged: object of {rel!r} does not match")
        for rel, data in written.items():
            entries[rel] = {"sha256": self._store_bytes(data), "size": len(data), "mode": 0o644}
        return self._record({"format": _SNAPSHOT_FORMAT, "files": entries, "dirs": dirs, "symlinks": links},
                            label=label, source=source)

    def _store_bytes(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        if not self.object_path(digest).exists():
            tmp_fd, tmp = tempfile.mkstemp(dir=self.objects / "tmp")
            try:
                with os.fdopen(tmp_fd, "wb") as out:
                    out.write(data)
                settle_object(tmp, self.object_path(digest), digest)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        return digest

    def _record(self, manifest: dict[str, Any], *, label: str, source: str) -> str:
        """Store ``manifest`` under its id (the sha256 of its canonical JSON) and note ``label``; returns the id."""
        raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        snapshot_id = hashlib.sha256(raw).hexdigest()
        path = self.manifests / f"{snapshot_id}.json"
        if not path.exists():
            tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
            tmp.write_bytes(raw)
            os.replace(tmp, path)
        self._note_label(snapshot_id, {"label": label, "source": source, "created_at": time.time()})
        return snapshot_id

    def _note_label(self, snapshot_id: str, entry: dict[str, Any]) -> None:
        """Append ``entry`` as one line of ``labels/<id>.jsonl``. Every run of one benchmark records the same
        snapshots, so a label file grows with the runs: rewritten whole as one JSON list (before), each record cost
        ~8 ms of CPU at 1,000 records and ~0.5 s at 100,000, and two workers recording at once lost one's entry.
        One ``write`` of one line with ``O_APPEND`` is O(1) and lands whole beside a concurrent one."""
        line = json.dumps(entry, separators=(",", ":")).encode() + b"\n"
        fd = os.open(self.labels / f"{snapshot_id}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                     0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

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

    def _is_object(self, digest: str, st: os.stat_result) -> bool:
        """Whether ``st`` is the inode stored as ``digest`` (so its bytes are that object's)."""
        try:
            obj = os.stat(self.object_path(digest))
        except FileNotFoundError:
            return False
        return (obj.st_dev, obj.st_ino) == (st.st_dev, st.st_ino)

    def _link(self, digest: str, size: int, dfd: int, name: str) -> os.stat_result | None:
        """Hard-link the object ``digest`` as ``name`` in ``dfd``, made read-only for everyone but root; its stat,
        or None when it cannot be linked here (another filesystem, too many links): the caller copies instead.

        Raises:
            SandboxError: the object is missing, or not the bytes its name says (hashed once per process; after
                that, known by its unchanged inode, size and mtime: ``benchwright.data.digests``).
        """
        path = self.object_path(digest)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise SandboxError(f"object {digest} is missing") from None
        if st.st_size != size:
            raise SandboxError(f"object {digest} does not match (size {st.st_size}, expected {size})")
        if file_digests.sha256(path) != digest:  # read once per process; then known by inode, size and mtime
            raise SandboxError(f"object {digest} does not match")
        if stat.S_IMODE(st.st_mode) != _LINKED_MODE:
            os.chmod(path, _LINKED_MODE)
        try:
            os.link(path, name, dst_dir_fd=dfd, follow_symlinks=False)
        except OSError as exc:
            if exc.errno in (errno.EXDEV, errno.EMLINK, errno.EPERM):
                return None
            raise
        return os.stat(name, dir_fd=dfd, follow_symlinks=False)

    def restore(self, snapshot_id: str, work: Path, *, uid: int | None, gid: int | None,
                link: bool = False) -> None:
        """Put the snapshot's files, directories and symlinks into ``work`` (a new, empty directory).

        Args:
            uid: Owner of what is restored (the sandbox's user), or None to keep the caller's.
            gid: Its group (default ``uid``).
            link: Restore regular files of at least ``LINK_MIN_BYTES`` without execute bits as hard links to their
                stored objects instead of copies. Only for a ``uid`` other than the store's owner and without
                privileges (a namespaced sandbox): a linked file is root-owned and 0444, so the sandbox can read
                it, replace or delete its name, but never write the shared inode, and root-side writers
                (``_write_file_into``) never write a file that has other links.

        Raises:
            SandboxError: the snapshot is unknown or damaged (a missing object, or one whose bytes do not match).
        """
        manifest = self.load(snapshot_id)
        owner = (uid, gid if gid is not None else uid) if uid is not None else None
        stamps: dict[str, tuple[int, int, int, int, int, str]] = {}
        linked: dict[str | tuple[int, int], tuple[int, int, str, int]] = {}
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
            mode = int(entry["mode"]) & 0o777
            dfd = _open_parent(work, parts, create=True, uid=uid, gid=gid)
            try:
                if link and entry["size"] >= LINK_MIN_BYTES and not mode & 0o111 and mode & 0o400:
                    try:
                        st = self._link(entry["sha256"], int(entry["size"]), dfd, parts[-1])
                    except SandboxError as exc:
                        raise SandboxError(f"snapshot {snapshot_id} is damaged: {rel!r}: {exc}") from None
                    if st is not None:
                        linked[rel] = (st.st_dev, st.st_ino, entry["sha256"], mode)
                        linked.setdefault((st.st_dev, st.st_ino), linked[rel])  # found again if renamed
                        continue
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
        if linked:
            self.linked[str(work)] = linked

    def forget(self, work: Path) -> None:
        """Drop what restore noted about ``work`` (the sandbox or staging directory is going away)."""
        self.restored.pop(str(work), None)
        self.linked.pop(str(work), None)


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
