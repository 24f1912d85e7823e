import pytest

from kvroute.metrics.utilization import contains_answer, exact_match, f1_score, normalize_answer


@pytest.mark.parametrize("text,norm", [
    ("The Eiffel Tower!", "eiffel tower"),
    ("  a   cat,  an owl ", "cat owl"),
    ("Velkirra.", "velkirra"),
])
def test_normalize(text, norm):
    assert normalize_answer(text) == norm


def test_f1_known_values():
    assert f1_score("Velkirra", ["Velkirra"]) == 1.0
    assert f1_score("the town of Velkirra", ["Velkirra"]) == pytest.approx(2 * (1 / 3) * 1 / (1 / 3 + 1))
    assert f1_score("Dunmarrow", ["Velkirra"]) == 0.0
    assert f1_score("x", []) == 0.0
    # best over several golds
    assert f1_score("March 1961", ["12 March 1961", "March 1961"]) == 1.0


def test_exact_and_contains():
    assert exact_match("The Velkirra.", ["velkirra"]) == 1.0
    assert exact_match("in Velkirra", ["Velkirra"]) == 0.0
    assert contains_answer("She was born in Velkirra in 1974.", ["Velkirra"])
    assert not contains_answer("Velkirrant", ["Velkirra"])
