"""α* against model size on planted truth: a known log-linear trend is recovered, a flat one is not invented."""

import numpy as np
import pandas as pd
import pytest

from kvroute.analysis.size import _expit, _logit, cliff_vs_size, target_label, zoo_params
from kvroute.analysis.synthetic import SyntheticModel, SyntheticSpec, synthetic_records

PARAMS = {"s": 10**8, "m": 10**9, "l": 10**10}
FAMILY = {"s": "planted", "m": "planted", "l": "planted"}  # three sizes of one family
RATIOS = (0.0, 0.25, 0.5, 0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def _planted(slope: float, *, base: float = 0.7, n: int = 60, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """Three models whose true α* follows logit α* = logit(base) + slope · (log10 N − 9)."""
    truth = {m: float(_expit(_logit(np.array(base)) + slope * (np.log10(p) - 9))) for m, p in PARAMS.items()}
    models = tuple(SyntheticModel(m, 4, 2, "llama", truth[m] - base) for m in PARAMS)
    spec = SyntheticSpec(models=models, presses=("snapkv",), press_offsets=(0.0,), families=("base",),
                         long_context_lengths=(), n_instances=n, ratios=RATIOS, base_alpha_star=base, k=60.0,
                         lo=0.02, hi=0.95, noise=0.1, seed=seed)
    return synthetic_records(spec), truth


def test_a_planted_rising_trend_is_recovered_with_its_projection():
    df, truth = _planted(0.5)
    by_model, trends = cliff_vs_size(df, PARAMS, n_boot=300, families=FAMILY)
    assert len(trends) == 1
    t = trends.iloc[0]
    assert t["joint"]  # the same instances in every model: resampled jointly
    assert t["n_models"] == 3 and t["verdict"] == "rises with size"
    assert t["slope_low"] > 0 and abs(t["slope"] - 0.5) < 0.2
    for m, a in truth.items():
        row = by_model[by_model["model"] == m].iloc[0]
        assert abs(row["alpha_star"] - a) < 0.04, (m, row["alpha_star"], a)
    # the projection at 14B lies on the planted line, inside its interval
    true_14 = float(_expit(_logit(np.array(0.7)) + 0.5 * (np.log10(14e9) - 9)))
    assert t["pred_14B_low"] <= true_14 <= t["pred_14B_high"]
    assert abs(t["pred_14B"] - true_14) < 0.04
    assert t["pred_14B_low"] < t["pred_14B"] < t["pred_14B_high"]


def test_a_flat_truth_reads_as_no_trend_not_as_a_size_effect():
    df, _ = _planted(0.0)
    _, trends = cliff_vs_size(df, PARAMS, n_boot=300, families=FAMILY)
    t = trends.iloc[0]
    assert t["verdict"] == "no detectable trend", t["reason"]
    assert t["slope_low"] < 0 < t["slope_high"]
    # the paper's 0.9 is far from a flat 0.7: the projection says so rather than echoing the paper
    assert not t["pred_14B_has_paper"]


@pytest.mark.statistical
def test_planted_intervals_cover_the_true_slope_most_of_the_time():
    hits = []
    for seed in range(8):
        df, _ = _planted(0.4, n=40, seed=seed)
        t = cliff_vs_size(df, PARAMS, n_boot=200, families=FAMILY)[1].iloc[0]
        hits.append(t["slope_low"] <= 0.4 <= t["slope_high"])
    assert sum(hits) >= 6, hits


def test_one_model_or_unsized_models_give_no_trend():
    df, _ = _planted(0.5)
    one = df[df["model"] == "s"]
    by_model, trends = cliff_vs_size(one, PARAMS, n_boot=50)
    assert by_model.empty and trends.empty
    by_model, trends = cliff_vs_size(df, {"s": 10**8, "m": 10**9}, n_boot=50)
    assert (by_model.set_index("model").loc["l", "status"]) == "no parameter count"
    assert trends.iloc[0]["n_models"] == 2


def test_a_model_without_a_cliff_makes_the_trend_undecided():
    df, _ = _planted(0.5)
    df = df.copy()
    df.loc[df["model"] == "l", "hallucinated"] = False  # the largest model never fails: no α* to place
    by_model, trends = cliff_vs_size(df, PARAMS, n_boot=100, families=FAMILY)
    assert by_model.set_index("model").loc["l", "status"] == "no_cliff"
    t = trends.iloc[0]
    assert t["n_models"] == 2 and t["verdict"] in ("rises with size", "cannot decide", "no detectable trend")
    df.loc[df["model"] == "m", "hallucinated"] = False
    t = cliff_vs_size(df, PARAMS, n_boot=100, families=FAMILY)[1].iloc[0]
    assert t["verdict"] == "cannot decide" and "at least 2" in t["reason"]


def test_long_context_is_left_to_the_length_analysis():
    df, _ = _planted(0.5)
    lc = df.assign(family="long_context")
    by_model, trends = cliff_vs_size(lc, PARAMS, n_boot=50)
    assert by_model.empty and trends.empty


@pytest.mark.parametrize("n,label", [(3e9, "3B"), (1.5e9, "1.5B"), (5e8, "500M"), (14e9, "14B")])
def test_target_labels(n, label):
    assert target_label(n) == label


def test_zoo_parameter_counts_are_the_model_cards():
    p = zoo_params()
    assert p["smollm2-135m"] == 135_000_000 and p["qwen2.5-0.5b"] == 490_000_000
    assert p["qwen2.5-1.5b"] == 1_540_000_000  # the loaded GGUF counts 1,777,088,000 (a separate output head)


@pytest.mark.statistical
def test_two_sizes_or_mixed_families_are_no_size_trend():
    # a real rise over three models, but of three families — or only two sizes of one: a difference of models
    df, _ = _planted(0.5)
    mixed = cliff_vs_size(df, PARAMS, n_boot=200)[1].iloc[0]
    assert mixed["verdict"] == "cannot decide" and "difference of models" in mixed["reason"]
    two = cliff_vs_size(df[df["model"] != "m"], PARAMS, n_boot=200, families=FAMILY)[1].iloc[0]
    assert two["verdict"] == "cannot decide"
    # the mutation: allow two sizes and the same two models read as a size trend
    loose = cliff_vs_size(df[df["model"] != "m"], PARAMS, n_boot=200, families=FAMILY, min_family_sizes=2)
    assert loose[1].iloc[0]["verdict"] == "rises with size"


@pytest.mark.statistical
def test_families_pool_only_when_every_model_ran_the_same_instances():
    truth = {m: 0.7 + 0.05 * i for i, m in enumerate(PARAMS)}
    models = tuple(SyntheticModel(m, 4, 2, "llama", truth[m] - 0.7) for m in PARAMS)
    spec = SyntheticSpec(models=models, presses=("snapkv",), press_offsets=(0.0,), families=("base", "hops"),
                         long_context_lengths=(), n_instances=30, ratios=RATIOS, base_alpha_star=0.7, k=60.0,
                         lo=0.02, hi=0.95, noise=0.1)
    df = synthetic_records(spec)
    by_model, trends = cliff_vs_size(df, PARAMS, n_boot=300, families=FAMILY)
    assert set(trends["family"]) == {"base", "hops", "all"}
    pooled = trends.set_index("family").loc["all"]
    assert pooled["joint"] and pooled["verdict"] == "rises with size"
    assert (by_model[by_model["family"] == "all"]["n_instances"] == 60).all()
    # a model that ran other instances: its pooled curve would compare another family mix
    other = df[df["model"] == "l"].assign(instance_id=lambda d: d["instance_id"] + "-x")
    _, trends = cliff_vs_size(pd.concat([df[df["model"] != "l"], other]), PARAMS, n_boot=300, families=FAMILY)
    pooled = trends.set_index("family").loc["all"]
    assert pooled["verdict"] == "cannot decide" and "different instances" in pooled["reason"]
    assert trends.set_index("family").loc["base", "verdict"] == "rises with size"  # per family: still decided
