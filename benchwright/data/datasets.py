"""Reading benchmark datasets: fetch bytes (Fetch), detect format and fields (Analyze), stream task rows.

Formats: JSONL (one object per line), a JSON array of objects, or CSV with a header row. Analyze normalizes any
of them to ``tasks.jsonl`` in the run's work directory: one JSON object per line, line i = task index i, which is
what Materialize streams from in batches. Which columns mean what is the Driver's call (``benchwright.drivers``).
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchwright import fastjson
from benchwright.data.dataset_access import DatasetAccess, open_source
from benchwright.errors import DatasetError

MAX_DATASET_BYTES = 2 * 1024**3
SPLIT_COLUMN = "split"
"""A column of this name (any case) says which split a row belongs to (§13: each split is a subset)."""


@dataclass(frozen=True)
class Fetched:
    path: Path
    sha256: str
    bytes: int
    format: str


@dataclass(frozen=True)
class Analysis:
    format: str
    rows: int
    columns: list[str]
    splits: dict[str, int]
    """Split name -> rows, when a ``split`` column is present."""


def fetch_dataset(*, source: str, dest_dir: Path, access: DatasetAccess,
                  on_refused: Callable[[str], None] = lambda host: None) -> Fetched:
    """Copy the dataset at ``source`` (URL or local path) into ``dest_dir``, hashing it on the way.

    The source is untrusted: :func:`~benchwright.data.dataset_access.open_source` applies the account's host policy, the
    internal-address refusal and the local-path rules; ``on_refused`` hears every refused host.

    Raises:
        DatasetError: a refusal, an error status, a missing file, a time bound, or data over
            ``MAX_DATASET_BYTES``.
        InvalidInput: a local path was given where the deployment or the account does not allow them.
        httpx.TransportError: a network fault (transient: the caller retries).
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    suffix = _suffix(source)
    dest = dest_dir / f"dataset{suffix}"
    digest = hashlib.sha256()
    size = 0
    tmp = dest.with_suffix(dest.suffix + ".part")
    with tmp.open("wb") as out:
        for chunk in open_source(source, access, on_refused):
            size += len(chunk)
            if size > MAX_DATASET_BYTES:
                raise DatasetError(f"dataset is larger than {MAX_DATASET_BYTES} bytes")
            digest.update(chunk)
            out.write(chunk)
    tmp.replace(dest)
    return Fetched(path=dest, sha256=digest.hexdigest(), bytes=size, format=detect_format(dest))


def _suffix(source: str) -> str:
    name = source.split("?", 1)[0].rsplit("/", 1)[-1].lower()
    for ext in (".jsonl", ".ndjson", ".json", ".csv"):
        if name.endswith(ext):
            return ext
    return ".data"


def detect_format(path: Path) -> str:
    """``jsonl``, ``json`` (array) or ``csv``, from the extension, else from the first non-blank byte."""
    ext = path.suffix.lower()
    if ext in (".jsonl", ".ndjson"):
        return "jsonl"
    if ext == ".csv":
        return "csv"
    with path.open("rb") as f:
        head = f.read(4096).lstrip()
    if head.startswith(b"["):
        return "json"
    if head.startswith(b"{"):
        return "jsonl"
    if ext == ".json":
        return "json"
    return "csv"


def iter_rows(path: Path, fmt: str) -> Iterator[dict[str, Any]]:
    """Stream the dataset's rows as dicts.

    Raises:
        DatasetError: a row is not an object, the file does not parse, or its bytes are not UTF-8, naming where.
    """
    if fmt == "jsonl":
        with path.open("rb") as f:
            for lineno, raw in enumerate(f, 1):
                # By orjson where it reads what json reads (benchwright.fastjson: ~1 µs a row instead of ~3); any
                # other line (blank, not UTF-8, not JSON, a NaN) as before, by _jsonl_line.
                item = fastjson.loads(raw, functools.partial(_jsonl_line, lineno=lineno))
                if item is _BLANK:
                    continue
                if type(item) is not dict:
                    item = _as_object(item, f"line {lineno}")
                yield item
    elif fmt == "json":
        data = _loads(_decode(path.read_bytes(), "the file"), "the file")
        if not isinstance(data, list):
            raise DatasetError("a JSON dataset must be an array of objects")
        for i, item in enumerate(data):
            yield _as_object(item, f"item {i}")
    elif fmt == "csv":
        with path.open("rb") as f:
            yield from csv.DictReader(_decoded_lines(f))
    else:
        raise DatasetError(f"unknown dataset format {fmt!r}")


_BLANK = object()


def _jsonl_line(raw: bytes, lineno: int) -> Any:
    """A JSONL line's value by ``json``, ``_BLANK`` for a line of whitespace.

    Raises:
        DatasetError: the line is not UTF-8 or not JSON, naming it.
    """
    line = _decode(raw, f"line {lineno}")
    if not line.strip():
        return _BLANK
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return _loads(line, f"line {lineno}")  # raises, naming the line


def _decoded_lines(raw: Iterable[bytes]) -> Iterator[str]:
    """Lines decoded one at a time, so an encoding error names its line (a text-mode file decodes 8 KiB blocks
    and reports neither line nor offset)."""
    for lineno, line in enumerate(raw, 1):
        yield _decode(line, f"line {lineno}")


def _decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"dataset {where} is not UTF-8: byte {data[exc.start]:#04x} at offset {exc.start} "
                           f"({exc.reason}); save the file as UTF-8") from exc


def _loads(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"dataset {where} is not valid JSON: {exc.msg}") from exc


def _as_object(item: Any, where: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise DatasetError(f"dataset {where} is a {type(item).__name__}, expected an object")
    return item


_ENCODE_ROW = json.JSONEncoder(ensure_ascii=False, default=str).encode
"""``json.dumps(row, ensure_ascii=False, default=str)`` (the same bytes) without an encoder made per row."""


def analyze_dataset(*, source: Path, fmt: str, tasks_path: Path) -> Analysis:
    """Detect columns and splits and write the normalized ``tasks.jsonl`` (streamed; memory stays flat).

    Raises:
        DatasetError: the dataset is empty or does not parse.
    """
    columns: dict[str, None] = {}
    splits: dict[str, int] = {}
    rows = 0
    tmp = tasks_path.with_suffix(".part")
    with tmp.open("w", encoding="utf-8") as out:
        for row in iter_rows(source, fmt):
            split: object = None
            seen_split = False
            for key, value in row.items():  # one pass: the columns, and the first split column's value
                name = str(key)
                if name not in columns:
                    columns[name] = None
                if not seen_split and name.lower() == SPLIT_COLUMN:
                    split, seen_split = value, True
            if isinstance(split, str):
                splits[split] = splits.get(split, 0) + 1
            rows += 1
            try:
                out.write(_ENCODE_ROW(row) + "\n")
            except UnicodeEncodeError as exc:  # a lone surrogate from a JSON escape such as "\ud800"
                tmp.unlink(missing_ok=True)
                raise DatasetError(f"dataset row {rows} holds text that is not valid Unicode "
                                   f"({exc.object[exc.start:exc.end]!r}: {exc.reason})") from exc
    if rows == 0:
        tmp.unlink(missing_ok=True)
        raise DatasetError("the dataset has no rows")
    tmp.replace(tasks_path)
    return Analysis(format=fmt, rows=rows, columns=list(columns), splits=splits)


def iter_task_rows(tasks_path: Path) -> Iterator[dict[str, Any]]:
    """Every row of a normalized tasks.jsonl, in task order (read as ``json`` reads it, by orjson where that is the
    same: ``benchwright.fastjson``)."""
    with tasks_path.open("rb") as f:
        for line in f:
            yield fastjson.loads(line)


def keep_rows(tasks_path: Path, indices: list[int]) -> None:
    """Rewrite tasks.jsonl to hold only rows ``indices`` (increasing), in that order: task i becomes row
    ``indices[i]`` (a subset, §7). Streamed, like the analysis."""
    wanted = iter(indices)
    target = next(wanted, None)
    tmp = tasks_path.with_suffix(".subset")
    with tasks_path.open("r", encoding="utf-8") as src, tmp.open("w", encoding="utf-8") as out:
        for index, line in enumerate(src):
            if target is None:
                break
            if index == target:
                out.write(line)
                target = next(wanted, None)
    tmp.replace(tasks_path)


def read_task_rows(tasks_path: Path, start: int, stop: int) -> list[dict[str, Any]]:
    """Rows ``start <= index < stop`` of a normalized tasks.jsonl."""
    out: list[dict[str, Any]] = []
    with tasks_path.open("rb") as f:
        for index, line in enumerate(f):
            if index >= stop:
                break
            if index >= start:
                out.append(fastjson.loads(line))
    return out
