"""A PEP 503 package index double: pure-Python wheels built in memory and the pages pip reads, for installs on
loopback (no internet). Used by tests of Setup's requirements and by ``bench/rerun.py``.

pip asks ``GET {index}/{name}/`` for a project page of links and then fetches the file a link names; ``page``
answers both for the wheels it is given, whatever server carries it.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Wheel:
    project: str
    filename: str
    data: bytes


def build_wheel(project: str, *, version: str = "1.0", module: bytes = b"VALUE = 42\n") -> Wheel:
    """A minimal pure-Python wheel: the module ``{project}/__init__.py``, its dist-info and a RECORD with hashes."""
    dist = f"{project}-{version}.dist-info"
    files = {f"{project}/__init__.py": module,
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: benchwright-testkit\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return Wheel(project=project, filename=f"{project}-{version}-py3-none-any.whl", data=buf.getvalue())


def page(path: str, wheels: list[Wheel], *, prefix: str = "/simple") -> tuple[bytes, str] | None:
    """The body and content type for ``path`` under an index rooted at ``prefix``: a project's page of links, or a
    wheel's bytes (``{prefix}/files/{filename}``); None for anything else (a 404)."""
    if not path.startswith(prefix + "/"):
        return None
    rest = path[len(prefix) + 1:]
    for wheel in wheels:
        if rest.rstrip("/") == wheel.project:
            return f'<a href="{prefix}/files/{wheel.filename}">{wheel.filename}</a>'.encode(), "text/html"
        if rest == f"files/{wheel.filename}":
            return wheel.data, "application/octet-stream"
    return None
