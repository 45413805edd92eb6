"""Find's catalog (ranking, loading, the catalog's own path rules) and Analyze's scoping phrases, as plain functions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchwright.data.dataset_access import DatasetAccess, LocalPathRules
from benchwright.data.datasets import fetch_dataset
from benchwright.drivers import DriverFailed
from benchwright.drivers.catalog import BUNDLED_CATALOG, catalog_fetch, load_catalog
from benchwright.drivers.scoping import parse_scope, select_rows
from benchwright.errors import DatasetError, InvalidInput

NO_LOCAL = DatasetAccess(local=LocalPathRules(deployment=False, account=False))


@pytest.mark.parametrize(("prompt", "name"), [
    ("run gsm8k on my model", "gsm8k-mini"),
    ("Grade School Math, first 10", "gsm8k-mini"),
    ("one MMLU question from each subject", "mmlu-mini"),
    ("berkeley function calling", "toolcall-mini"),
    ("python coding problems with unit tests", "humaneval-mini"),
    ("multiple-choice exam questions", "mmlu-mini"),
])
def test_bundled_catalog_resolves_by_name_alias_and_keywords(prompt: str, name: str) -> None:
    best = load_catalog(BUNDLED_CATALOG).rank(prompt)[0]
    assert best.entry.name == name and best.why


def test_every_bundled_entry_is_a_readable_file_inside_the_catalog() -> None:
    catalog = load_catalog(BUNDLED_CATALOG)
    assert len(catalog.entries) >= 5
    for entry in catalog.entries:
        path = catalog.local_path(entry)
        assert path.is_file() and path.parent == BUNDLED_CATALOG.parent


def _catalog(tmp_path: Path, entries: list[dict[str, object]]) -> Path:
    root = tmp_path / "cat"
    root.mkdir()
    (root / "ok.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    path = root / "catalog.json"
    path.write_text(json.dumps({"datasets": entries}))
    return path


def test_catalog_paths_are_read_under_the_catalogs_rules_only(tmp_path: Path) -> None:
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"question": "s", "answer": "s"}\n')
    cat_path = _catalog(tmp_path, [{"name": "ok", "path": "ok.jsonl"}, {"name": "escape", "path": "../secret.jsonl"},
                                   {"name": "link", "path": "link.jsonl"}])
    (cat_path.parent / "link.jsonl").symlink_to(secret)
    catalog = load_catalog(cat_path)
    # The account may not read local paths at all, yet the operator's bundled file is read.
    where, access = catalog_fetch("catalog:ok", catalog=catalog, access=NO_LOCAL)
    fetched = fetch_dataset(source=where, dest_dir=tmp_path / "w", access=access)
    assert fetched.bytes == (cat_path.parent / "ok.jsonl").stat().st_size
    with pytest.raises(InvalidInput, match="leaves the catalog's directory"):
        catalog_fetch("catalog:escape", catalog=catalog, access=NO_LOCAL)
    with pytest.raises((InvalidInput, DatasetError), match=r"leaves the catalog's directory|outside"):
        where, access = catalog_fetch("catalog:link", catalog=catalog, access=NO_LOCAL)
        fetch_dataset(source=where, dest_dir=tmp_path / "w2", access=access)
    with pytest.raises(InvalidInput, match="no dataset named 'nope'"):
        catalog_fetch("catalog:nope", catalog=catalog, access=NO_LOCAL)
    # Anything that is not a catalog source keeps the account's own rules.
    assert catalog_fetch(str(secret), catalog=catalog, access=NO_LOCAL) == (str(secret), NO_LOCAL)


@pytest.mark.parametrize(("entries", "message"), [
    ([{"path": "ok.jsonl"}], "needs a 'name'"),
    ([{"name": "x"}], "exactly one of 'url' and 'path'"),
    ([{"name": "x", "path": "ok.jsonl", "url": "https://example.org/d.jsonl"}], "exactly one of"),
])
def test_malformed_catalogs_are_named(tmp_path: Path, entries: list[dict[str, object]], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        load_catalog(_catalog(tmp_path, entries))


ROWS = [
    {"question": "q0", "subject": "algebra", "split": "train"},
    {"question": "q1", "subject": "algebra", "split": "test"},
    {"question": "q2", "subject": "anatomy", "split": "test"},
    {"question": "q3", "subject": "abstract_algebra", "split": "test"},
    {"question": "q4", "subject": "anatomy", "split": "test"},
]
COLUMNS = ["question", "subject", "split"]


@pytest.mark.parametrize(("prompt", "indices", "synthetic"), [
    ("the first 2", [0, 1], True),
    ("one question from each subject", [0, 2, 3], True),
    ("one per subjects", [0, 2, 3], True),
    ("only the anatomy questions", [2, 4], True),
    ("only abstract algebra", [3], True),
    ("the test split", [1, 2, 3, 4], False),
    ("the test split, one from each subject, the first 2", [1, 2], True),
])
def test_scoping_phrases(prompt: str, indices: list[int], synthetic: bool) -> None:
    subset = select_rows(parse_scope(prompt), columns=COLUMNS, rows=iter(ROWS))
    assert subset is not None and subset.indices == indices and subset.synthetic is synthetic and subset.recipe


def test_no_scoping_phrase_means_every_row() -> None:
    assert select_rows(parse_scope("evaluate mmlu"), columns=COLUMNS, rows=iter(ROWS)) is None


@pytest.mark.parametrize(("prompt", "message"), [
    ("one per category", "no column is called that"),
    ("the validation split", r"its splits: \['test', 'train'\]"),
    ("only the astronomy questions", "no column has the value 'astronomy'; the values that exist: split: test, "
                                     "train; subject: abstract_algebra, algebra, anatomy$"),
])
def test_a_scope_the_dataset_cannot_meet_is_an_error(prompt: str, message: str) -> None:
    with pytest.raises(DriverFailed, match=message):
        select_rows(parse_scope(prompt), columns=COLUMNS, rows=iter(ROWS))


def test_near_misses_match_descriptions_in_either_number() -> None:
    """"capital cities quiz" names no entry, but the trivia set's description says "capitals": it leads the
    nearest entries Find lists (issue 22), and no entry is picked on one shared keyword."""
    ranked = load_catalog(BUNDLED_CATALOG).rank("capital cities quiz")
    assert ranked[0].entry.name == "trivia-mini" and "capital" in ranked[0].why
    assert ranked[0].score < 2  # a hint, not a match


def test_an_unmatched_only_lists_the_category_values_of_a_real_dataset() -> None:
    rows = [json.loads(line) for line in (BUNDLED_CATALOG.parent / "mmlu-mini.jsonl").read_text().splitlines()]
    with pytest.raises(DriverFailed) as failed:
        select_rows(parse_scope("mmlu, only the astronomy questions"), columns=list(rows[0]), rows=iter(rows))
    subjects = sorted({r["subject"] for r in rows})
    assert f"the values that exist: subject: {', '.join(subjects)}" in failed.value.message
    assert "question:" not in failed.value.message and "answer:" not in failed.value.message


def test_the_deployments_catalog_is_parsed_once_and_again_when_its_file_changes(tmp_path: Path) -> None:
    from activities.driving import catalog_of
    from benchwright.settings import Settings

    path = tmp_path / "catalog.json"
    path.write_text(json.dumps({"datasets": [{"name": "one", "url": "https://example.invalid/1.jsonl"}]}))
    settings = Settings(data_dir=tmp_path, catalog_path=path)
    first = catalog_of(settings)
    assert catalog_of(settings) is first  # unchanged: the parsed catalog is reused
    path.write_text(json.dumps({"datasets": [{"name": "one", "url": "https://example.invalid/1.jsonl"},
                                             {"name": "two", "url": "https://example.invalid/2.jsonl"}]}))
    assert [e.name for e in catalog_of(settings).entries] == ["one", "two"]  # edited: read again
    path.unlink()
    with pytest.raises(InvalidInput, match="cannot be read"):
        catalog_of(settings)
