import pytest

from kvroute.metrics.abstention import ABSTENTION_PHRASES, is_abstention


@pytest.mark.parametrize("text", [
    "I don't know", "I don’t know.", "i do not know", "Unknown", "It is not mentioned in the text.",
    "The text does not say.", "The text doesn't say where she went.", "Cannot be determined",
    "It can't be determined from the text", "Not stated.", "There is no information about that.",
    "None", "N/A", "The answer is unclear.", "This is ambiguous.", "Not specified",
])
def test_abstentions(text):
    assert is_abstention(text)


@pytest.mark.parametrize("text", [
    "Velkirra", "Maren Oskvold", "12 March 1961", "17", "the Brasswind Guild", "Unknowlton",
    "She knows the answer: Dunmarrow", "Nonesuch Company", "a moon otter",
])
def test_answers_are_not_abstentions(text):
    assert not is_abstention(text)


def test_phrase_list_is_lower_case():
    assert all(p == p.lower() for p in ABSTENTION_PHRASES)
