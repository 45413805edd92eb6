"""The deployment's dataset catalog: what Find resolves a natural-language prompt against (§2, §3).

A YAML (or JSON) file the operator configures (``Settings.catalog_path``; the embedded stack ships
``benchwright/samples/catalog.yaml``, one bundled sample per scorer shape)::

    datasets:
      - name: gsm8k-mini
        aliases: [gsm8k, grade school math]
        description: Grade-school math word problems with a numeric final answer.
        path: gsm8k-mini.jsonl          # or  url: https://...
        format: jsonl
        splits: [test]
        license: MIT

``path`` is relative to the catalog file and must stay inside its directory: a catalog path is the operator's
file, so Fetch reads it under the catalog's own rules (that directory only, opened without following symlinks),
not the launching account's local-path grant. ``url`` sources are fetched as untrusted, like a launch's URL.

Find ranks the registry beside the catalog (``Catalog.with_registry``): each registered (benchmark, subset) the
caller can see is an entry whose source is the subset's current snapshot (``benchwright.registry.find``).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchwright.data.dataset_access import DatasetAccess, LocalPathRules
from benchwright.errors import InvalidInput

BUNDLED_CATALOG = Path(__file__).resolve().parents[1] / "samples" / "catalog.yaml"
REGISTRY_SOURCE = "registry:"
"""A registered subset snapshot (``registry:<subset_id>@<version>``; ``benchwright.registry.catalog`` owns it)."""
CATALOG_SOURCE = "catalog:"
"""How a dataset bundled with the catalog is named (FetchArtifact.source): ``catalog:<name>``."""

_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    ["a", "an", "and", "are", "as", "at", "be", "by", "can", "do", "for", "from", "how", "i", "in", "is", "it", "me",
     "my", "of", "on", "one", "only", "or", "please", "run", "some", "test", "the", "their", "them", "this", "to",
     "use", "using", "want", "with", "evaluate", "eval", "benchmark", "dataset", "questions", "question", "model",
     "models", "first", "each", "sample", "samples", "every", "all"])


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def stem(word: str) -> str:
    """A plural folded to its singular ("capitals" -> "capital", "cities" -> "city", "boxes" -> "box"), so a
    prompt's keyword meets a description's in either number."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("ches", "shes", "sses", "xes", "zes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def keyword_stems(text: str) -> set[str]:
    """The words of ``text`` that count as keywords (no stopword, in either number), folded by :func:`stem`."""
    return {stem(w) for w in words(text) if w not in _STOPWORDS and stem(w) not in _STOPWORDS}


@dataclass(frozen=True)
class RegistryRef:
    """What a registry entry stands for: a subset snapshot of a benchmark, and the impl it would score with."""

    benchmark_id: str
    benchmark_name: str
    subset_id: str
    subset_name: str
    subset_version: int
    tasks: int
    impl_id: str | None
    """The subset's latest official impl; None when none was promoted (the Driver then writes the scorer)."""
    own: bool
    """The caller's own benchmark (else a public one of another account)."""

    @property
    def dataset(self) -> str:
        return f"{REGISTRY_SOURCE}{self.subset_id}@{self.subset_version}"

    def pin(self) -> dict[str, object]:
        """The run's pin when it scores with ``impl_id`` (as a pinned launch records it)."""
        return {"benchmark_id": self.benchmark_id, "subset_id": self.subset_id,
                "subset_version": self.subset_version, "impl_id": self.impl_id}


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    description: str = ""
    aliases: tuple[str, ...] = ()
    url: str | None = None
    path: str | None = None
    """Relative to the catalog's directory."""
    format: str | None = None
    splits: tuple[str, ...] = ()
    license: str | None = None
    registry: RegistryRef | None = None
    """Set on the registry's entries (``Catalog.with_registry``)."""

    @property
    def source(self) -> str:
        """What DatasetResolved records as the dataset: the URL, ``catalog:<name>``, or a registered subset's
        ``registry:<subset_id>@<version>``."""
        if self.registry is not None:
            return self.registry.dataset
        return self.url or f"{CATALOG_SOURCE}{self.name}"

    def keywords(self) -> set[str]:
        # A registry entry's description is generated ("registered benchmark ..."): only its names count.
        out = keyword_stems(self.name) | (keyword_stems(self.description) if self.registry is None else set())
        for alias in self.aliases:
            out |= keyword_stems(alias)
        return out


@dataclass(frozen=True)
class Match:
    entry: CatalogEntry
    score: float
    why: str


@dataclass(frozen=True)
class Catalog:
    entries: tuple[CatalogEntry, ...]
    root: Path
    """The catalog file's directory: bundled paths must resolve inside it."""
    origin: str = ""

    def with_registry(self, entries: list[CatalogEntry]) -> Catalog:
        """This catalog with the registry's entries ranked first: a tie between a registered benchmark and a
        catalog dataset goes to the registry, whose runs are comparable (a pinned subset snapshot and impl)."""
        return dataclasses.replace(self, entries=(*entries, *self.entries))

    def get(self, name: str) -> CatalogEntry:
        for entry in self.entries:
            if entry.name == name:
                return entry
        raise InvalidInput(f"the catalog has no dataset named '{name}'", code="catalog_entry_missing")

    def local_path(self, entry: CatalogEntry) -> Path:
        """The bundled file of ``entry``, which must lie inside the catalog's directory.

        Raises:
            InvalidInput: the entry has no path, or its path leaves the catalog's directory.
        """
        if entry.path is None:
            raise InvalidInput(f"catalog entry '{entry.name}' has no bundled path")
        root = self.root.resolve()
        resolved = (root / entry.path).resolve()
        if root not in resolved.parents:
            raise InvalidInput(f"catalog entry '{entry.name}' path {entry.path!r} leaves the catalog's directory "
                               f"{root}; bundled datasets must lie inside it", code="dataset_blocked")
        return resolved

    def rank(self, prompt: str) -> list[Match]:
        """Every entry scored against ``prompt``, best first.

        A name or alias that appears in the prompt as whole words scores 10 (+1 per word, so "gsm8k mini" beats
        "gsm8k"); otherwise each description keyword the prompt shares scores 1. Ties keep catalog order.
        """
        text = " " + " ".join(words(prompt)) + " "
        said = keyword_stems(prompt)
        out: list[Match] = []
        for entry in self.entries:
            best: tuple[float, str] = (0.0, "")
            for label in (entry.name, *entry.aliases):
                phrase = " ".join(words(label))
                if phrase and f" {phrase} " in text:
                    score = 10.0 + len(phrase.split())
                    if score > best[0]:
                        best = (score, f"the prompt names it ('{label}')")
            if best[0] == 0.0:
                shared = sorted(said & entry.keywords())
                if shared:
                    where = "name" if entry.registry else "description"
                    best = (float(len(shared)), f"the prompt shares the keywords {', '.join(shared)} with its {where}")
            if best[1] and entry.registry is not None:
                ref = entry.registry
                owner = "the caller's own" if ref.own else "public"
                said_why = (f"{best[1]}: registered benchmark '{ref.benchmark_name}' ({ref.benchmark_id}, {owner}), "
                            f"subset '{ref.subset_name}' snapshot v{ref.subset_version} ({ref.tasks} tasks)")
                best = (best[0], said_why)
            if best[0] == 0.0:
                # near misses: the prompt's words against the names and, word by word, the description
                labels = [entry.name.lower(), *(a.lower() for a in entry.aliases), *entry.keywords()]
                similarity = max(difflib.SequenceMatcher(None, w, label).ratio() for label in labels
                                 for w in [*said, ""])
                best = (similarity / 2, "")  # < 0.5: only ever a 'nearest' hint, never a match
            out.append(Match(entry=entry, score=best[0], why=best[1]))
        return sorted(out, key=lambda m: -m.score)


MIN_KEYWORDS = 2
"""Shared description keywords a prompt needs (when it names no entry) for the builtin driver to pick an entry."""


def load_catalog(path: Path) -> Catalog:
    """Read a catalog file (YAML or JSON).

    Raises:
        InvalidInput: the file is missing or malformed, naming what is wrong.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInput(f"the dataset catalog {path} cannot be read: {exc.strerror}",
                           code="catalog_invalid") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise InvalidInput(f"the dataset catalog {path} does not parse: {exc}", code="catalog_invalid") from None
    items = data.get("datasets") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise InvalidInput(f"the dataset catalog {path} needs a top-level 'datasets' list", code="catalog_invalid")
    entries = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInput(f"dataset catalog {path}: entry {i} needs a 'name'", code="catalog_invalid")
        if bool(item.get("url")) == bool(item.get("path")):
            raise InvalidInput(f"dataset catalog {path}: entry '{item['name']}' needs exactly one of 'url' and "
                               "'path'", code="catalog_invalid")
        entries.append(CatalogEntry(
            name=item["name"], description=str(item.get("description", "")),
            aliases=tuple(str(a) for a in item.get("aliases") or ()), url=item.get("url"), path=item.get("path"),
            format=item.get("format"), splits=tuple(str(s) for s in item.get("splits") or ()),
            license=item.get("license")))
    return Catalog(entries=tuple(entries), root=path.parent, origin=str(path))


def catalog_fetch(source: str, *, catalog: Catalog, access: DatasetAccess) -> tuple[str, DatasetAccess]:
    """What Fetch reads for ``source``: a ``catalog:<name>`` source becomes its bundled file, readable under rules
    that allow exactly the catalog's directory (the operator's files, whatever the account's local-path grant),
    still refusing the protected places and opened without following symlinks. Any other source is returned as is,
    with the account's own access.

    Raises:
        InvalidInput: no such entry, or its path leaves the catalog's directory.
    """
    if not source.startswith(CATALOG_SOURCE):
        return source, access
    entry = catalog.get(source.removeprefix(CATALOG_SOURCE))
    if entry.url is not None:
        return entry.url, access
    rules = LocalPathRules(deployment=True, account=True, protected=access.local.protected,
                          roots=(catalog.root.resolve(),))
    return str(catalog.local_path(entry)), dataclasses.replace(access, local=rules)
