"""benchmarks.option_answers' scoring against probe 132's hand judgments (no model)."""

from benchmarks.option_answers import check_judged


def test_scores_agree_with_the_hand_judgments():
    checked = check_judged()
    assert checked["answers"] == 44
    assert checked["disagree"] == []
