"""The rules of benchwright.scoring.results (issue 21): what counts as no_answer, group labels and their bounds, folding
past the group limit, the recorded model input's bound."""

from __future__ import annotations

from benchwright.scoring.results import (
    MAX_INPUT_CHARS,
    MAX_LABEL_CHARS,
    audit_fields,
    candidate_columns,
    group_label,
    group_results,
    is_no_answer,
    model_input,
    reference_column,
)


def test_no_answer_needs_a_fail_whose_every_trial_said_extracted_false() -> None:
    none = {"extracted": False}
    assert is_no_answer("fail", [none, none])
    assert not is_no_answer("fail", [none, {"extracted": True}])
    assert not is_no_answer("fail", [none, {}])  # a scorer that does not say answered, as far as we know
    assert not is_no_answer("fail", [{"extracted": 0}])  # only JSON false counts
    assert not is_no_answer("fail", [none, None])
    assert not is_no_answer("pass", [none])
    assert not is_no_answer("err", [none])
    assert not is_no_answer("fail", [])


def test_group_labels_are_bounded_text() -> None:
    assert group_label("algebra") == "algebra"
    assert group_label(None) == group_label("") == "(none)"
    assert group_label(3) == "3" and group_label(True) == "true" and group_label(["a", 1]) == '["a", 1]'
    long = group_label("x" * 10_000)
    assert len(long) == MAX_LABEL_CHARS and long.endswith("…")


def test_groups_past_the_limit_fold_into_other_smallest_first() -> None:
    labels = ["big"] * 5 + ["mid"] * 3 + ["s1", "s2"]
    settled = [(i, "pass" if i % 2 == 0 else "fail", i == 9) for i in range(10)] + [(99, "pass", False)]
    groups, folded = group_results(labels, settled, max_groups=2)
    assert folded == 2
    assert [g.group for g in groups] == ["big", "mid", "(other)"]
    other = groups[-1]
    assert (other.total, other.passed, other.failed, other.no_answer) == (2, 1, 1, 1)
    assert groups[0].pass_rate == 3 / 5 and groups[0].pass_rate_ci is not None
    assert sum(g.total for g in groups) == 10  # index 99 is past the data: ignored


def test_unsettled_and_unscored_groups() -> None:
    groups, _ = group_results(["a", "a", "b"], [(0, "err", False)])
    a, b = groups
    assert (a.errored, a.unsettled, a.pass_rate, a.pass_rate_ci) == (1, 1, None, None)
    assert (b.total, b.unsettled) == (1, 1)


def test_model_input_is_role_lines_and_bounded() -> None:
    text = model_input([{"role": "system", "content": "Be brief."},
                        {"role": "user", "content": [{"type": "text", "text": "2+2?"}]}])
    assert text == "system: Be brief.\nuser: 2+2?"
    huge = model_input([{"role": "user", "content": "x" * 100_000}] * 50)
    assert huge is not None and len(huge) == MAX_INPUT_CHARS
    assert model_input(None) is None


def test_candidates_and_reference_columns() -> None:
    columns = ["id", "Question", "Subject", "difficulty", "Answer"]
    assert candidate_columns(columns) == ["Subject", "difficulty"]
    assert candidate_columns(columns, "id") == ["id", "Subject", "difficulty"]
    assert candidate_columns(columns, "nope") == ["Subject", "difficulty"]
    assert reference_column(columns, None) == "Answer"
    assert reference_column(columns, "id") == "id"
    assert reference_column(["q"], None) is None


def test_audit_fields_read_score_meta() -> None:
    fields = audit_fields({"extracted": True, "answer": 42, "rule": "boxed", "reference": "42"}, "user: q")
    assert fields == {"input": "user: q", "answer": "42", "rule": "boxed", "extracted": True, "reference": "42"}
    assert audit_fields(None) == {"input": None, "answer": None, "rule": None, "extracted": None, "reference": None}
    bridged = audit_fields({"input": "the sample", "target": "B"})  # a harness bridge's trial
    assert bridged["input"] == "the sample" and bridged["reference"] == "B"


def test_a_listing_shows_the_tail_of_a_long_input() -> None:
    recorded = "system: " + "rules " * 1000 + "\nuser: the question?"
    listed = audit_fields({}, recorded, input_chars=100)["input"]
    assert len(listed) == 100 and listed.startswith("…") and listed.endswith("user: the question?")
    assert audit_fields({}, recorded)["input"] == recorded
