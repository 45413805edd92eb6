"""Phase-to-phase metadata comes from the run's events: which work file is the fetched dataset (its FetchArtifact,
``handoff.dataset_file``) and which of the parent's work files a fork carries over (``forks.inherited_files``).
Nothing here reads a metadata file (fetch.json, snapshots.json) from a work directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchwright.errors import InvalidInput
from benchwright.events import FetchArtifact
from benchwright.runs.forks import LoggedEvent, copy_workdir, inherited_files
from benchwright.runs.handoff import dataset_file

DATA, TASKS, IMPL = "a" * 64, "b" * 64, "c" * 64


def _fetched(**extra: Any) -> dict[str, Any]:
    return FetchArtifact(source="https://x.example/d.csv", sha256=DATA, bytes=3, format="csv",
                         **extra).model_dump(mode="json")


def test_the_fetch_artifact_names_the_dataset_file() -> None:
    assert dataset_file(_fetched(file="dataset.csv"), {}) == "dataset.csv"


def test_an_artifact_from_before_fetch_named_its_file_is_matched_by_content() -> None:
    legacy = _fetched()  # recorded before the field existed (a cache cell, an old parent): file is None
    assert legacy["file"] is None
    files = {"fetch.json": "d" * 64, "tasks.jsonl": DATA, "dataset.csv": DATA, "task_impl.py": IMPL}
    assert dataset_file(legacy, files) == "dataset.csv", "Fetch's own file over a tasks.jsonl of the same bytes"
    assert dataset_file(legacy, {"data.jsonl": DATA}) == "data.jsonl"
    with pytest.raises(InvalidInput) as missing:
        dataset_file(legacy, {"tasks.jsonl": TASKS})
    assert missing.value.code == "dataset_file_missing"


def _log(*events: tuple[str, dict[str, Any]]) -> list[LoggedEvent]:
    return [LoggedEvent(seq=i, type=t, data=d) for i, (t, d) in enumerate(events)]


PARENT = _log(
    ("RunLaunched", {}), ("PhaseStarted", {"phase": "fetch"}), ("FetchArtifact", _fetched(file="dataset.data")),
    ("PhaseRestartRequested", {"phase": "fetch"}), ("PhaseStarted", {"phase": "fetch"}),
    ("FetchArtifact", _fetched(file="dataset.csv")), ("PhaseCompleted", {"phase": "fetch"}),
    ("PhaseStarted", {"phase": "analyze"}), ("PhaseCompleted", {"phase": "analyze"}),
)


def test_a_fork_carries_the_work_files_of_the_phases_it_inherits() -> None:
    cut = len(PARENT)
    files = {"dataset.csv": DATA, "tasks.jsonl": TASKS, "task_impl.py": IMPL}
    assert inherited_files(inherited=["find"], events=PARENT, cut=cut, parent_files=files) == []
    assert inherited_files(inherited=["find", "fetch"], events=PARENT, cut=cut, parent_files=files) == \
        ["dataset.csv"], "the last FetchArtifact before the cut: the restarted Fetch's"
    assert inherited_files(inherited=["find", "fetch", "analyze", "setup", "attach", "atomize"], events=PARENT,
                           cut=cut, parent_files=files) == ["dataset.csv", "tasks.jsonl", "task_impl.py"]
    assert inherited_files(inherited=["find", "fetch"], events=PARENT, cut=4, parent_files=files) == \
        ["dataset.data"]
    with pytest.raises(InvalidInput) as no_fetch:
        inherited_files(inherited=["find", "fetch"], events=PARENT[:2], cut=2, parent_files=files)
    assert no_fetch.value.code == "parent_state_missing"


def test_copy_workdir_copies_the_named_files_and_refuses_a_missing_one(tmp_path: Path) -> None:
    parent, fork = tmp_path / "parent", tmp_path / "fork"
    parent.mkdir()
    (parent / "dataset.csv").write_text("q,a\n1,2\n")
    (parent / "tasks.jsonl").write_text('{"q": "1"}\n')
    (parent / "other.txt").write_text("not inherited")
    copy_workdir(parent=parent, fork=fork, names=["dataset.csv", "tasks.jsonl"])
    assert sorted(p.name for p in fork.iterdir()) == ["dataset.csv", "tasks.jsonl"]
    assert (fork / "dataset.csv").read_text() == "q,a\n1,2\n"
    with pytest.raises(InvalidInput) as missing:
        copy_workdir(parent=parent, fork=fork, names=["task_impl.py"])
    assert missing.value.code == "parent_state_missing"
