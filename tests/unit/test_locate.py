"""Answers found in real text: tolerant matching mapped back to exact original offsets, and evidence sentences."""

from hypothesis import given
from hypothesis import strategies as st

from kvroute.tasks.locate import NormalizedText, enclosing_sentence, find_all, locate, match_key, merge


def texts(ctx, spans):
    return [ctx[s:e] for s, e in spans]


def test_every_occurrence_is_found_with_exact_offsets():
    ctx = "The code is 4471. Nobody forgot it.\nLater the code 4471 came back, and 4471 again!"
    loc = locate(ctx, ["4471"])
    assert texts(ctx, loc.answer_spans) == ["4471", "4471", "4471"]
    assert loc.counts == (3,) and loc.found
    assert [ctx.index("4471", s) for s, _ in loc.answer_spans] == [s for s, _ in loc.answer_spans]


def test_case_whitespace_and_quotes_are_tolerated_and_offsets_cover_the_original_text():
    ctx = "Tea with  mrs.\tO\u2019BRIEN in\nNew   York was lovely. She said \u201cHello there\u201d twice."
    loc = locate(ctx, ["Mrs. O'Brien", "new york", '"hello there"'])
    got = texts(ctx, loc.answer_spans)
    assert got == ["mrs.\tO\u2019BRIEN", "New   York", "\u201cHello there\u201d"]
    assert loc.counts == (1, 1, 1)


def test_whole_words_only():
    ctx = "In 1995 there were 5 cats, 55 dogs and a catalogue."
    assert texts(ctx, locate(ctx, ["5"]).answer_spans) == ["5"]
    assert texts(ctx, locate(ctx, ["cat"]).answer_spans) == []
    # an answer ending in punctuation needs no word boundary after it
    assert texts(ctx, locate(ctx, ["cats,"]).answer_spans) == ["cats,"]


def test_absent_answer_gives_no_spans():
    loc = locate("Nothing relevant is said here.", ["Velkirra", "  "])
    assert not loc.found and loc.answer_spans == () and loc.evidence_spans == () and loc.counts == (0, 0)


def test_evidence_is_the_enclosing_sentence_within_its_line():
    ctx = "First sentence here. The needle is 7731 today! Third one.\nA list line with 7731 in it\nlast"
    loc = locate(ctx, ["7731"])
    assert texts(ctx, loc.evidence_spans) == ["The needle is 7731 today!", "A list line with 7731 in it"]
    for (a, b), (s, e) in zip(loc.answer_spans, loc.evidence_spans, strict=True):
        assert s <= a and b <= e


def test_two_answers_in_one_sentence_share_one_evidence_span():
    ctx = "Intro. Paris, France is where Paris lies. Outro."
    loc = locate(ctx, ["Paris", "Paris, France"])
    assert texts(ctx, loc.answer_spans) == ["Paris", "Paris, France", "Paris"]  # sorted by (start, end)
    assert loc.counts == (2, 1)
    assert texts(ctx, loc.evidence_spans) == ["Paris, France is where Paris lies."]


def test_long_sentences_are_cut_to_a_window_around_the_answer():
    words = [f"w{i}" for i in range(400)]
    words[200] = "NEEDLE"
    ctx = " ".join(words)
    s, e = enclosing_sentence(ctx, ctx.index("NEEDLE"), ctx.index("NEEDLE") + 6, max_chars=100)
    assert e - s <= 100 and "NEEDLE" in ctx[s:e]
    assert ctx[s - 1] == " " and ctx[e] == " "  # cut at word boundaries


def test_unicode_normalisation_maps_back_to_original_characters():
    n = NormalizedText.of("Stra\u00dfe \uff11\uff12\uff13  \ufb01ne")  # ß, full-width digits, ﬁ ligature
    assert n.text == "strasse 123 fine"
    i = n.text.index("123")
    assert n.original[slice(*n.span(i, i + 3))] == "\uff11\uff12\uff13"
    assert find_all(n, "FINE") == [(n.original.index("\ufb01"), len(n.original))]
    assert match_key("  It\u2019s \u2014 OK ") == "it's - ok"


def test_merge():
    assert merge([(5, 9), (0, 3), (2, 4), (9, 10)]) == ((0, 4), (5, 10))


@given(st.text(alphabet="ab \n.", max_size=60), st.sampled_from(["a", "ab", "b a", "a.b"]))
def test_found_spans_normalise_to_the_answer(ctx, answer):
    for s, e in locate(ctx, [answer]).answer_spans:
        assert match_key(ctx[s:e]) == match_key(answer)
        assert not ctx[s - 1:s].isalnum() if s and answer[0].isalnum() else True
