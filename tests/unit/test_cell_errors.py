"""Errored cells (status "error") in the store, the loader and the analysis: kept as finished, left
out of every estimate, counted by press and reason. No model."""

import json

import pandas as pd
import pytest

from kvroute.analysis.load import ERRORS_ATTR, drop_errors, load_records
from kvroute.analysis.summary import analyze
from kvroute.analysis.synthetic import SyntheticSpec, synthetic_records
from kvroute.errors import CELL_ERRORS, EngineError, error_reason
from kvroute.sweep.store import Store

REASON = "EngineError: oracle needs evidence positions; this prompt has none"


@pytest.fixture(scope="module")
def records() -> pd.DataFrame:
    return synthetic_records(SyntheticSpec(n_instances=20, families=("base",)))


def errored_rows(df: pd.DataFrame, n: int = 6) -> pd.DataFrame:
    """Error records as the runner writes them: identity and task tags, status, error; no metrics."""
    keep = ["model", "instance_id", "regime", "seed", "family", "unanswerable"]
    rows = df[df["ratio"] > 0].drop_duplicates("instance_id").head(n)[keep].copy()
    rows["press"], rows["ratio"], rows["status"], rows["error"] = "oracle", 0.5, "error", REASON
    return rows


def test_error_reason_is_one_line_with_the_type():
    assert error_reason(ValueError("a\n  b\tc")) == "ValueError: a b c"
    assert error_reason(EngineError("x" * 900)).endswith("…") and len(error_reason(EngineError("x" * 900))) == 500
    assert issubclass(EngineError, CELL_ERRORS) and ValueError in CELL_ERRORS
    assert not issubclass(RuntimeError, CELL_ERRORS) and not issubclass(KeyboardInterrupt, CELL_ERRORS)


@pytest.mark.statistical
def test_errored_cells_change_no_estimate_and_are_counted(records):
    ok = records.assign(status="ok")
    bad = errored_rows(records)
    mixed = pd.concat([ok, bad], ignore_index=True)
    clean, dirty = analyze(ok, n_boot=50), analyze(mixed, n_boot=50)
    assert dirty["n_records"] == clean["n_records"] == len(ok)
    for table in ("cliffs", "cliff_curves", "routing", "decomposition"):
        assert dirty.get(table) == clean.get(table), table
    assert dirty["cell_errors"] == {"n": len(bad), "groups": [
        {"model": bad["model"].iloc[0], "press": "oracle", "error": REASON, "n": len(bad), "ratios": [0.5]}]}
    assert dirty["notes"]["cell_errors"].startswith(f"{len(bad)} cells errored")
    assert clean["cell_errors"] == {"n": 0, "groups": []} and "cell_errors" not in clean["notes"]


def test_load_records_drops_errored_rows_and_keeps_their_count(records, tmp_path):
    bad = errored_rows(records, n=3)
    f = tmp_path / "records.jsonl"
    rows = [*records.head(30).assign(status="ok").to_dict("records"), *bad.to_dict("records")]
    f.write_text("\n".join(json.dumps({k: v for k, v in r.items() if not (isinstance(v, float) and v != v)},
                                      default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
                           for r in rows) + "\n")
    df = load_records(f)
    assert len(df) == 30 and set(df["status"]) == {"ok"}
    assert df.attrs[ERRORS_ATTR][0]["n"] == 3
    assert df["hallucinated"].dtype == bool  # no NaN left from the metric-less rows
    rest, groups = drop_errors(df)
    assert len(rest) == 30 and groups[0]["n"] == 3 and groups[0]["error"] == REASON
    assert analyze(df, n_boot=20)["cell_errors"]["n"] == 3


def rec(key, **over):
    r = {"key": key, "model": "m", "instance_id": "i" + key, "press": "knorm", "ratio": 0.5, "regime": "agnostic",
         "seed": 0, "settings": "s", "status": "ok", "f1": 1.0, "hallucinated": False, "ger": 0.0}
    r.update(over)
    return r


def bad(key, **over):
    r = {k: v for k, v in rec(key, press="oracle", **over).items() if k not in ("f1", "hallucinated", "ger")}
    return {**r, "status": "error", "error": REASON}


def test_the_store_keeps_errored_cells_as_finished_and_counts_them(tmp_path):
    with Store.open(tmp_path) as s:
        s.write([rec("a"), bad("b"), bad("c"), bad("d", settings="other")])
        assert s.keys() == {"a", "b", "c", "d"}  # a resume skips errored cells
        summary = {r["press"]: r for r in s.summary("s")}
        assert summary["oracle"]["n"] == 2 and summary["oracle"]["errors"] == 2 and summary["oracle"]["f1"] is None
        assert summary["knorm"]["errors"] == 0 and summary["knorm"]["f1"] == 1.0
        assert s.errors("s") == [{"model": "m", "press": "oracle", "error": REASON, "n": 2, "instance_id": "ib"}]
        assert s.delete_errors() == 3
        assert s.keys() == {"a"} and s.errors() == []
