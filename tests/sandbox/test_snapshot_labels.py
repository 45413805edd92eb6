"""Who made a snapshot is appended to ``labels/<id>.jsonl``, one line per record: every run of a benchmark records the
same snapshots, so the file grows with the runs, and a record must not rewrite what is there (a JSON list rewritten
whole cost ~8 ms at 1,000 records and ~0.5 s at 100,000) nor lose another worker's record made at the same moment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchwright.sandbox import LocalBackend

FILES = {"task_impl.py": b"class Scorer: ...\n", "tasks.jsonl": b'{"q": 1}\n'}
RECORDER = """
import asyncio, sys
from pathlib import Path
from benchwright.sandbox import LocalBackend

async def main(root: Path, who: str, n: int) -> None:
    backend = LocalBackend(root)
    for i in range(n):
        await backend.snapshot_files({"task_impl.py": b"class Scorer: ...\\n", "tasks.jsonl": b'{"q": 1}\\n'},
                                     label=f"{who}:{i}")
    await backend.close()

asyncio.run(main(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
"""


def _records(backend: LocalBackend, snapshot_id: str) -> list[dict[str, object]]:
    text = (backend.snapshots.labels / f"{snapshot_id}.jsonl").read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


async def test_each_record_of_one_snapshot_is_one_line_appended(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "data")
    try:
        first = await backend.snapshot_files(FILES, label="run-a:atomize:v1")
        before = (backend.snapshots.labels / f"{first}.jsonl").read_bytes()
        ids = {await backend.snapshot_files(FILES, label=f"run-{i}:atomize:v1") for i in range(3)}
        assert ids == {first}  # the same content is the same snapshot, whoever makes it
        after = (backend.snapshots.labels / f"{first}.jsonl").read_bytes()
        assert after.startswith(before)  # appended to, never rewritten
        records = _records(backend, first)
        assert [r["label"] for r in records] == ["run-a:atomize:v1", *(f"run-{i}:atomize:v1" for i in range(3))]
        assert all(r["source"] == "files" and isinstance(r["created_at"], float) for r in records)
        other = await backend.snapshot_files({"other.txt": b"x"}, label="run-b:setup:v1")
        assert [r["label"] for r in _records(backend, other)] == ["run-b:setup:v1"]
    finally:
        await backend.close()


def test_workers_recording_the_same_snapshot_at_once_lose_no_record(tmp_path: Path) -> None:
    root, n = tmp_path / "data", 40
    workers = [subprocess.Popen([sys.executable, "-c", RECORDER, str(root), f"w{w}", str(n)],
                                stderr=subprocess.PIPE) for w in range(4)]
    for proc in workers:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    backend = LocalBackend(root)
    (label_file,) = backend.snapshots.labels.glob("*.jsonl")
    records = _records(backend, label_file.stem)
    assert sorted(r["label"] for r in records) == sorted(f"w{w}:{i}" for w in range(4) for i in range(n))
