"""The fingerprint rule as plain functions (§6): one complete table, canonical JSON, U+001E joins, 12 hex."""

from __future__ import annotations

import hashlib

from benchwright.fingerprint import (
    LOAD_BEARING,
    artifact_types,
    canonical,
    derive,
    impl_id,
)
from benchwright.registry.identicon import identicon_svg


def test_every_artifact_type_has_exactly_one_rule() -> None:
    assert set(artifact_types()) == set(LOAD_BEARING)


def test_derivation_is_mechanical_and_ignores_noise_and_other_events() -> None:
    log = [(0, "RunLaunched", {"launch": {}}),
           (3, "FetchArtifact", {"source": "http://a:1/x", "sha256": "ab", "bytes": 2, "format": "jsonl"}),
           (4, "AgentTextEvent", {"phase": "analyze", "text": "hi"}),
           (9, "AtomizeArtifact", {"invocation": 2, "impl_sha256": "cd", "source": "launch"})]
    fp, inputs = derive(log)
    joined = canonical({"bytes": 2, "format": "jsonl", "sha256": "ab"}) + "\x1e" + canonical({"impl_sha256": "cd"})
    assert fp == hashlib.sha256(joined.encode()).hexdigest()[:12]
    assert [i.seq for i in inputs] == [3, 9] and inputs[0].canonical == '{"bytes":2,"format":"jsonl","sha256":"ab"}'
    noisy = [(s, t, {**d, "source": "http://mirror:2/y", "invocation": 7}) for s, t, d in log]
    assert derive(noisy)[0] == fp


def test_bridge_runs_of_different_harness_tasks_differ_in_fingerprint() -> None:
    """A bridge run has no Fetch/Analyze/Atomize artifacts: its HarnessTaskArtifact is what says which task ran."""
    def log(config_sha256: str, version: str = "0.3.285") -> list[tuple[int, str, dict[str, object]]]:
        return [(0, "RunLaunched", {"launch": {}}),
                (5, "ModelProxyArtifact", {"model_id": "openai/dev", "litellm_config_yaml": "model_list: []\n"}),
                (9, "HarnessTaskArtifact", {"harness": "inspect", "version": version, "task": "qa",
                                            "config_sha256": config_sha256}),
                (20, "HarnessLogArtifact", {"harness": "inspect", "filename": "x.eval", "sha256": "ff", "bytes": 3})]

    assert derive(log("aa"))[0] != derive(log("bb"))[0]
    assert derive(log("aa"))[0] != derive(log("aa", version="0.3.286"))[0]
    assert derive(log("aa"))[0] == derive(log("aa"))[0]


def test_impl_ids_are_scoped_to_their_benchmark() -> None:
    digest = hashlib.sha256(b"class Scorer: ...").hexdigest()
    assert impl_id(benchmark_id="bm-1", impl_sha256=digest) == f"bm-1:{digest[:12]}"
    assert impl_id(benchmark_id="bm-1", impl_sha256=digest) != impl_id(benchmark_id="bm-2", impl_sha256=digest)


def test_identicon_depends_on_the_id_alone() -> None:
    assert identicon_svg("bm-x") == identicon_svg("bm-x") != identicon_svg("bm-y")
