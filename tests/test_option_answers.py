"""benchmarks.option_answers' scoring against probe 132's hand judgments (no model)."""

from benchmarks.option_answers import check_judged


def test_scores_agree_with_the_hand_judgments():
    checked = check_judged()
    assert checked["answers"] == 44
    assert checked["disagree"] == []


def test_cases_and_set_select_questions_and_a_wrong_name_is_an_error():
    import pytest

    from benchmarks.option_answers import questions, select

    qs = questions()
    picked = select(qs, "man_rm:-f,help_grep:-v")
    assert [(q.page, q.option) for q in picked] == [("man_rm", "-f"), ("help_grep", "-v")]
    assert [q.option for q in select(qs, "man_uniq")] == ["-c", "-d"]
    held = select(qs, "", "held_out")
    assert len(held) == 12 and {q.set for q in held} == {"held_out"}
    assert [q.page for q in select(qs, "man_touch:-a", "held_out")] == ["man_touch"]
    with pytest.raises(SystemExit):
        select(qs, "man_touch:-a,man_rm:-f", "held_out")  # rm's -f is a tuned question
    with pytest.raises(SystemExit):
        select(qs, "man_rm:-Q")
    with pytest.raises(SystemExit):
        select(qs, "", "nope")
