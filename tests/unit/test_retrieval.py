"""Retrieval heads: the hit count on hand-built argmaxes, and the analysis on planted records."""

import numpy as np
import pandas as pd
import torch

from kvroute.analysis.retrieval import retrieval_heads, retrieval_scores, retrieval_survival, retrieval_vs_ger
from kvroute.metrics.retrieval import retrieval_hits


def test_a_head_hits_when_it_attends_most_to_the_answer_token_being_copied():
    context = [10, 11, 12, 13, 14, 12]  # token 12 also at 5, outside the answer
    answer = [2, 3]
    first = torch.tensor([[2, 0, 5]])  # producing token 0 (12): head 0 on the answer's 12; head 2 on the other 12
    steps = torch.tensor([[[3, 3, 4]]])  # producing token 1 (13): heads 0 and 1 on it
    hits, events = retrieval_hits([12, 13, 99], first, steps, context, answer)
    assert events == 2  # 99 copies nothing
    assert hits.tolist() == [[2.0, 1.0, 0.0]]


def _planted(n=60, seed=0):
    """Model m: 2 layers, 4 query heads on 2 KV heads. Head (1, 3) retrieves in every full-cache record; the other
    heads never. Compressed cells hallucinate exactly when KV head (1, 1) loses the answer; GER is noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        hits = [[0, 0, 0, 0], [0, 0, 0, 4]]
        rows.append(dict(model="m", instance_id=f"i{i}", press="none", ratio=0.0, retrieval_hits=hits,
                         retrieval_events=4, answer_kept_heads=[[1.0, 1.0], [1.0, 1.0]], ger=0.0, hallucinated=False))
        for ratio in (0.5, 0.9):
            kept = rng.random((2, 2))
            rows.append(dict(model="m", instance_id=f"i{i}", press="p", ratio=ratio, retrieval_hits=None,
                             retrieval_events=None, answer_kept_heads=kept.tolist(), ger=float(rng.random()),
                             hallucinated=bool(kept[1, 1] < 0.5)))
    return pd.DataFrame(rows)


def test_planted_retrieval_heads_are_found_and_predict_better_than_ger():
    df = _planted()
    scores = retrieval_scores(df)
    top = scores.sort_values("score").iloc[-1]
    assert (top["layer"], top["head"], top["score"]) == (1, 3, 1.0) and (scores["score"] < 0.1).sum() == 7
    heads = retrieval_heads(scores)
    assert heads["m"].heads == [(1, 3)] and heads["m"].num_heads == 4
    surv = retrieval_survival(df, heads)
    comp = df["ratio"] > 0
    assert np.allclose(surv[comp], [k[1][1] for k in df.loc[comp, "answer_kept_heads"]])  # query head 3 → KV head 1
    t = retrieval_vs_ger(df, n_boot=200).iloc[0]
    assert t["auc_retrieval"] == 1.0 and abs(t["auc_ger"] - 0.5) < 0.15
    assert t["low"] > 0 and t["verdict"] == "retrieval survival predicts better"


def test_too_few_copying_events_give_no_retrieval_heads():
    df = _planted(n=1)
    df.loc[df["press"] == "none", "retrieval_events"] = 4
    assert retrieval_heads(retrieval_scores(df)) == {}
    assert retrieval_vs_ger(df).empty


def test_a_sweep_reads_the_same_retrieval_heads_from_records_as_the_analysis():
    """kvroute.metrics.retrieval.heads_from_records (what restore=…@heads:retrieval uses) and the analysis's scores
    pick the same heads from the same records, and both refuse too few copying events."""
    from kvroute.metrics.retrieval import heads_from_records

    df = _planted()
    records = df.to_dict("records")
    assert heads_from_records(records)["m"] == retrieval_heads(retrieval_scores(df))["m"]
    few = _planted(n=1)
    few.loc[few["press"] == "none", "retrieval_events"] = 4
    assert heads_from_records(few.to_dict("records")) == {"m": None}
