"""The registered analysis sections: skipped with a stated reason when their columns are absent, run in order."""

import pandas as pd
import pytest

from kvroute.analysis import summary
from kvroute.analysis.common import AnalysisError
from kvroute.analysis.sections import SECTIONS, AnalysisSection, SectionInput
from kvroute.analysis.summary import AnalysisConfig, run_analysis
from kvroute.analysis.synthetic import SyntheticSpec, synthetic_records
from kvroute.registry import Registry


@pytest.fixture(scope="module")
def records() -> pd.DataFrame:
    return synthetic_records(SyntheticSpec(n_instances=3, families=("base",), long_context_lengths=()))


def _registry(*sections: AnalysisSection) -> Registry[AnalysisSection]:
    reg: Registry[AnalysisSection] = Registry("analysis section")
    for s in sections:
        reg.add(s)
    return reg


def _never(x: SectionInput) -> pd.DataFrame:
    raise AssertionError("a skipped section must not run")


def _raises(x: SectionInput) -> pd.DataFrame:
    raise AnalysisError("nothing to fit")


def test_a_section_missing_its_columns_is_skipped_with_its_reason_and_the_rest_run_in_order(records, monkeypatch):
    seen: list[str] = []

    def made(name: str, *out: str):
        def run(x: SectionInput) -> tuple[pd.DataFrame, ...]:
            seen.append(name)
            # a later section reads the tables of the sections before it
            return tuple(pd.DataFrame({"n": [len(x.tables)]}) for _ in out)
        return AnalysisSection(name, ("ratio",), out, run)

    reg = _registry(
        made("first", "t_first_a", "t_first_b"),
        AnalysisSection("absent", ("ratio", "no_such_column", "nor_this"), ("t_absent",), _never),
        AnalysisSection("not_here", (), ("t_not_here",), _never, applies=lambda x: "no such family in these records"),
        AnalysisSection("fails", ("ratio",), ("t_fails",), _raises),
        made("last", "t_last"),
    )
    monkeypatch.setattr(summary, "SECTIONS", reg)
    a = run_analysis(records, AnalysisConfig(n_boot=10))
    assert seen == ["first", "last"]
    assert a.summary["notes"] == {"absent": "skipped: the records have no no_such_column, nor_this",
                                  "not_here": "skipped: no such family in these records",
                                  "fails": "skipped: nothing to fit"}
    assert list(a.tables) == ["t_first_a", "t_first_b", "t_last"]
    assert a.tables["t_last"]["n"].iloc[0] == 2  # the first section's two tables were there before it
    assert [k for k in a.summary if k.startswith("t_")] == list(a.tables)


def test_a_section_returns_as_many_tables_as_it_declares(records, monkeypatch):
    bad = AnalysisSection("bad", (), ("one", "two"), lambda x: (pd.DataFrame(),))
    monkeypatch.setattr(summary, "SECTIONS", _registry(bad))
    with pytest.raises(ValueError):
        run_analysis(records, AnalysisConfig(n_boot=10))


def test_the_registry_holds_every_section_once_in_summary_order():
    names = SECTIONS.names()
    assert names[:4] == ["cliff", "cliff_caused", "context_length", "model_size"]
    assert names.index("ger_within_ratio") < names.index("press_league")  # the league reads the within-ratio link
    produced = [t for _, s in SECTIONS.items() for t in s.produces]
    assert len(produced) == len(set(produced))
    assert names[-3:] == ["identity_probe", "lens_profiles", "probe"]
