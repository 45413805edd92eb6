"""Stack traces as accounts may see them (§5, issue 23): the frames' ``file:line`` and code, never the server's layout.

``PhaseFailed.stack_trace`` is shown to the run's owner (and to anyone reading a public run). A raw trace names
absolute paths of the server (the checkout, the virtualenv, the user's home); ``relative_trace`` rewrites them
relative to what a reader can look up: the repository (``benchwright/runs/launch.py``), site-packages (``litellm/...``),
the standard library (``<stdlib>/asyncio/...``); any other absolute path keeps its last two parts (``…/x/y.py``).
Traces are made with ``traceback.format_exception``, which never includes local variables' values.
"""

from __future__ import annotations

import re
import site
import sys
import sysconfig
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_TRACE_CHARS = 8000


def _roots() -> list[tuple[str, str]]:
    """(absolute prefix, what replaces it), longest first so the narrowest root wins."""
    pairs: dict[str, str] = {}
    stdlib = sysconfig.get_paths().get("stdlib")
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            pairs[path] = ""
    for path in [*getattr(site, "getsitepackages", list)(), site.getusersitepackages()]:
        pairs[path] = ""
    if stdlib:
        pairs[stdlib] = "<stdlib>/"
    pairs[str(REPO_ROOT)] = ""
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        pairs.setdefault(prefix, "<python>/")
    home = str(Path.home())
    if home not in ("/", ""):
        pairs.setdefault(home, "~/")
    out = []
    for path, replacement in pairs.items():
        for variant in {path, str(Path(path).resolve())}:
            out.append((variant.rstrip("/") + "/", replacement))
    return sorted(out, key=lambda p: len(p[0]), reverse=True)


_ROOTS = _roots()
_ABSOLUTE = re.compile(r"(?<![\w.~<>/:-])/(?:[^\s\"'/:,()]+/)+[^\s\"'/:,()]+")


def relative_trace(text: str) -> str:
    """``text`` (a formatted trace, or any message) with the server's absolute paths made relative."""
    for prefix, replacement in _ROOTS:
        text = text.replace(prefix, replacement)
    return _ABSOLUTE.sub(lambda m: "…/" + "/".join(m.group(0).split("/")[-2:]), text)


def format_trace(exc: BaseException) -> str:
    """The trace of ``exc`` (its frames, their code lines, the exception chain), paths made relative, the last
    ``MAX_TRACE_CHARS`` of it."""
    return relative_trace("".join(traceback.format_exception(exc)))[-MAX_TRACE_CHARS:]
