"""The kvpress catalogue against kvpress itself and against kvroute's registries."""

import inspect

import kvpress
import pytest

from kvroute.errors import ConfigError, UnknownNameError
from kvroute.presses import SCORERS, SELECTIONS, build_press
from kvroute.presses.catalogue import CATALOGUE, OFFERED, by_name, unavailable
from kvroute.presses.scorers import KvpressScorer

STATUSES = {*OFFERED, "weights", "own ratio", "out of scope", "not yet", "base class"}


def _kvpress_presses() -> set[str]:
    return {n for n in kvpress.__all__ if n.endswith("Press") and inspect.isclass(getattr(kvpress, n))}


def test_every_press_kvpress_exports_is_listed_once():
    listed = [e.kvpress for e in CATALOGUE]
    assert len(listed) == len(set(listed))
    assert set(listed) == _kvpress_presses(), (
        "kvpress exports presses the catalogue does not list (or the other way round): add each to "
        "kvroute.presses.catalogue.CATALOGUE with what kvroute makes of it")
    assert {e.status for e in CATALOGUE} <= STATUSES
    for e in CATALOGUE:
        assert e.offered or e.why, f"{e.kvpress}: a press kvroute does not offer needs its reason"


def test_every_offered_entry_is_what_kvroute_builds():
    for e in CATALOGUE:
        if e.status not in OFFERED:
            continue
        spec = e.kvroute.replace("SCORER", "knorm")
        press = build_press(spec)
        assert press.name.split("+")[0].split("[")[0] == spec.split("+")[0].split("[")[0], e
        if e.status == "scorer":
            assert isinstance(press.scorer, KvpressScorer) and press.scorer.press_cls.__name__ == e.kvpress, e
        else:
            assert press.selection.name == e.name, e


def test_every_kvpress_scorer_and_selection_in_the_registries_is_catalogued():
    names = by_name()
    for n, cls in SCORERS.items():
        if issubclass(cls, KvpressScorer):
            assert n in names and names[n].kvpress == cls.press_cls.__name__, n
    counterparts = {e.name for e in CATALOGUE if e.status == "selection"} | {"per_head", "global"}
    assert set(SELECTIONS.names()) - counterparts == {"routes", "shared"}  # kvroute's own


@pytest.mark.parametrize("name, says", [
    ("duo_attention", "cannot follow a ratio grid"),
    ("DuoAttentionPress", "head_compression_ratio"),
    ("dms[threshold=0.1]", "threshold"),
    ("simlayerkv", "lazy"),
    ("think", "key channels"),
    ("key_rerotation", "re-rotates"),
    ("merging", "merges"),
    ("decoding", "while the answer is generated"),
    ("lukv", "budget curves"),
    ("SnapKVPress", "in kvroute it is 'snapkv'"),
    ("AdaKVPress", "'SCORER+adakv'"),
    ("adakv", "a selection strategy, not a scorer"),
    ("pyramid+per_head", "e.g. 'snapkv+pyramid'"),
])
def test_presses_kvroute_does_not_offer_say_why_in_one_line(name, says):
    with pytest.raises(ConfigError) as err:
        build_press(name)
    msg = str(err.value)
    assert says in msg and "\n" not in msg and not isinstance(err.value, UnknownNameError)


def test_unknown_names_still_suggest():
    assert unavailable("snapkvv") is None
    with pytest.raises(UnknownNameError, match="did you mean 'snapkv'"):
        build_press("snapkvv")
