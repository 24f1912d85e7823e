"""Metrics on hand-built masks and attention tensors whose values are known in advance."""

from dataclasses import dataclass, field

import pytest
import torch

from kvroute.metrics.accessibility import Accessibility, EvidenceRollout, RoutedReachability
from kvroute.metrics.base import CellContext, MetricSettings
from kvroute.metrics.consensus import Consensus, consensus_and_rho, group_consensus_and_rho
from kvroute.metrics.hallucination import classify
from kvroute.metrics.representation import hidden_cosine
from kvroute.metrics.retention import eviction_rate, ger, ger_all_layers, ger_per_layer, heads_retaining
from kvroute.presses import KeepMask


def test_ger_one_head_of_four_keeps_the_token():
    mask = torch.zeros(2, 4, 10, dtype=torch.bool)
    mask[0, 2, 5] = True  # layer 0: token 5 kept by KV head 2 only; layer 1: evicted everywhere
    assert ger_per_layer(mask, [5]) == [0.0, 1.0]
    assert ger(mask, [5]) == 0.5
    assert heads_retaining(mask, [5, 6]) == 1
    assert ger_all_layers(mask, [5]) == 0.0  # survives somewhere
    mask[0, 2, 5] = False
    assert ger(mask, [5]) == 1.0 and ger_all_layers(mask, [5]) == 1.0
    assert ger(mask, []) is None


def test_eviction_rate():
    mask = torch.ones(3, 2, 4, dtype=torch.bool)
    mask[:, :, 0] = False  # token 0 gone from every head of every layer
    mask[1, 0, 1] = False  # token 1 gone from one head only: not evicted
    assert eviction_rate(mask) == pytest.approx(1 / 4)


def test_consensus_all_heads_on_one_token():
    a = torch.full((1, 6, 8), 0.01)
    a[0, :, 3] = 0.9  # every head's argmax is token 3
    cons, rho = consensus_and_rho(a)
    assert cons == [pytest.approx(1 / 6)] and rho == [1.0]


def test_consensus_all_heads_distinct_and_sink_handling():
    a = torch.full((1, 4, 10), 0.01)
    for h in range(4):
        a[0, h, 0] = 0.5  # a sink everyone attends most
        a[0, h, 4 + h] = 0.3  # then each head its own token
    cons, rho = consensus_and_rho(a)
    assert cons == [0.25] and rho == [1.0]
    cons_ns, rho_ns = consensus_and_rho(a, skip=4)
    assert cons_ns == [1.0] and rho_ns == [0.25]


def test_group_consensus_averages_each_kv_group_before_the_argmax():
    # 2 layers, 2 KV groups of 3 query heads; keys 0-3 are sinks
    a = torch.full((2, 6, 12), 0.01)
    a[:, :, 0] = 0.6  # every head's raw argmax is the sink
    for h in range(6):
        a[:, h, 4 + h] = 0.2  # each head its own non-sink key: per-head sink-free consensus 6/6
    a[0, 0:3, 10] = 0.15  # layer 0: group 0's heads share key 10 (mean 0.15 + 0.2/3 beats any single key's 0.2/3)
    a[0, 3:6, 11] = 0.15  # group 1 shares key 11: 2 distinct over 2 groups
    a[1, :, 10] = 0.15  # layer 1: both groups share key 10
    assert consensus_and_rho(a, skip=4) == ([1.0, 1.0], [pytest.approx(1 / 6), pytest.approx(1 / 6)])
    assert group_consensus_and_rho(a, 3, skip=4) == ([1.0, 0.5], [0.5, 1.0])
    assert group_consensus_and_rho(a, 3) == ([0.5, 0.5], [1.0, 1.0])  # with sinks both groups pick key 0
    assert group_consensus_and_rho(a, 1, skip=4) == consensus_and_rho(a, skip=4)  # G = 1 is the per-head value
    with pytest.raises(ValueError, match="groups of 4"):
        group_consensus_and_rho(a, 4)


def test_consensus_metric_names_its_variants_and_defaults_to_sink_free():
    a = torch.full((1, 4, 10), 0.01)
    a[0, :, 0] = 0.5  # the sink
    for h in range(4):
        a[0, h, 4 + h] = 0.3 + 0.01 * h  # no ties inside a KV group
    ctx = CellContext(instance=None, prompt=_Prompt(10, [], []), mask=None, output=_Out(a), full=_Out(a),
                      group_size=2, settings=MetricSettings(n_sink=4))
    out = Consensus().compute(ctx)
    assert set(out) == set(Consensus.fields)
    assert not {"consensus", "rho", "consensus_mean", "rho_mean"} & set(out)  # no name that hides the sinks
    assert out["consensus_nosink"] == [1.0] and out["rho_nosink"] == [0.25]
    assert out["consensus_withsink"] == [0.25] and out["rho_withsink"] == [1.0]
    assert out["consensus_group_nosink"] == [1.0] and out["rho_group_nosink"] == [0.5]
    assert out["consensus_nosink_mean"] == 1.0 and out["rho_nosink_mean"] == 0.25


def test_consensus_is_undefined_when_only_sinks_are_visible():
    a = torch.rand(2, 4, 3)
    cons, rho = consensus_and_rho(a, skip=4)
    assert len(cons) == 2 and all(c != c for c in cons + rho)  # NaN, not an argmax over nothing
    cg, _ = group_consensus_and_rho(a, 2, skip=4)
    assert all(c != c for c in cg)


def test_hidden_cosine_skips_embeddings():
    h = torch.randn(4, 8)
    f = h.clone()
    f[2] = -f[2]
    assert hidden_cosine(h, f) == pytest.approx([1.0, -1.0, 1.0])


@pytest.mark.parametrize("answer,golds,distractors,unans,expected", [
    ("Velkirra", ["Velkirra"], ["Dunmarrow"], False, "correct"),
    ("She was born in Velkirra.", ["Velkirra"], ["Dunmarrow"], False, "correct"),
    ("I don't know.", ["Velkirra"], [], False, "abstained"),
    ("The text does not say.", ["Velkirra"], [], False, "abstained"),
    ("Dunmarrow", ["Velkirra"], ["Dunmarrow", "Quarrystead"], False, "distractor"),
    ("She was born in Quarrystead.", ["Velkirra"], ["Dunmarrow", "Quarrystead"], False, "distractor"),
    ("Zabriskville", ["Velkirra"], ["Dunmarrow"], False, "fabricated"),
    ("12 March 1962", ["12 March 1961"], [], False, "partial"),
    ("I don't know", ["I don't know"], ["Tobin Hale"], True, "correct"),
    ("It cannot be determined from the text", ["I don't know"], [], True, "correct"),
    ("Tobin Hale", ["I don't know"], ["Tobin Hale", "Maren"], True, "distractor"),
    ("Bartholomew", ["I don't know"], ["Tobin Hale"], True, "fabricated"),
    ("", ["Velkirra"], [], False, "fabricated"),
    # a wrong binding that shares a word with the gold is a distractor, never partial (issue 14)
    ("Frostfield League", ["Cobaltwick League"], ["Frostfield League", "Ashgrove Guild"], False, "distractor"),
    ("It was the Frostfield League.", ["Cobaltwick League"], ["Frostfield League"], False, "distractor"),
    ("7 September 1904", ["12 September 1953"], ["7 September 1904"], False, "distractor"),
    # hedging words do not turn a correct answer into an abstention
    ("The text does not say exactly, but it is Pellmarsh", ["Pellmarsh"], ["Dunmarrow"], False, "correct"),
    ("I'm not sure, but I think it is Velkirra.", ["Velkirra"], ["Dunmarrow"], False, "correct"),
    # an abstention that names a candidate value is not a clean abstention: a (hedged) wrong binding
    ("I don't know, maybe Dunmarrow", ["Velkirra"], ["Dunmarrow"], False, "distractor"),
    ("Not sure, perhaps Tobin Hale", ["I don't know"], ["Tobin Hale"], True, "distractor"),
    # sharing a word with the gold but naming no candidate value: partial; an abstention without one: abstained
    ("Cobaltwick", ["Cobaltwick League"], ["Frostfield League"], False, "partial"),
    ("I don't know which league", ["Cobaltwick League"], ["Frostfield League"], False, "abstained"),
])
def test_taxonomy_table(answer, golds, distractors, unans, expected):
    assert classify(answer, golds, distractors, unanswerable=unans) == expected


@pytest.mark.parametrize("answer,golds,distractors,unans", [
    ("Frostfield League", ["Cobaltwick League"], ["Frostfield League"], False),
    ("7 September 1904", ["12 September 1953"], ["7 September 1904"], False),
    ("Zabriskville", ["Velkirra"], [], False),
    ("Tobin Hale", ["I don't know"], ["Tobin Hale"], True),
    ("Bartholomew", ["I don't know"], [], True),
    ("I don't know, maybe Tobin Hale", ["I don't know"], ["Tobin Hale"], True),
])
def test_wrong_bindings_and_non_abstentions_on_unanswerable_items_are_hallucinations(answer, golds, distractors, unans):
    from kvroute.metrics.hallucination import HALLUCINATIONS

    assert classify(answer, golds, distractors, unanswerable=unans) in HALLUCINATIONS


_SUSPECTS = ["Maren Osk", "Iver Lund"]


@pytest.mark.parametrize("answer,golds,distractors,unans,expected", [
    # the gold named among other candidate values: a hedge over the candidates, not an answer
    ("Maren Osk, Iver Lund and Tobin Hale", ["Tobin Hale"], _SUSPECTS, False, "listed"),
    ("Maren Osk or Tobin Hale", ["Tobin Hale"], _SUSPECTS, False, "listed"),
    ("I'm not sure: Tobin Hale or perhaps Iver Lund.", ["Tobin Hale"], _SUSPECTS, False, "listed"),
    # ruling the others out still names them (SCIENCE.md: the gold and another candidate named is listed)
    ("Tobin Hale, not Maren Osk", ["Tobin Hale"], _SUSPECTS, False, "listed"),
    # a distractor that shares a word with the gold, named beside it
    ("Cobaltwick League or Frostfield League", ["Cobaltwick League"], ["Frostfield League"], False, "listed"),
    # the gold alone, with or without a sentence around it
    ("Tobin Hale", ["Tobin Hale"], _SUSPECTS, False, "correct"),
    ("It was Tobin Hale who signed it.", ["Tobin Hale"], _SUSPECTS, False, "correct"),
    # a distractor that contains the gold is no second candidate, named alone or twice
    ("Tobin Hale Jr", ["Tobin Hale"], ["Tobin Hale Jr", "Iver Lund"], False, "correct"),
    # a distractor inside the gold's own words is no second candidate either (also when the gold repeats)
    ("Cobaltwick League", ["Cobaltwick League"], ["Cobaltwick", "Frostfield League"], False, "correct"),
    ("Cobaltwick League, yes, Cobaltwick League", ["Cobaltwick League"], ["Cobaltwick"], False, "correct"),
    # ... but named outside them it is one
    ("Cobaltwick League or just Cobaltwick", ["Cobaltwick League"], ["Cobaltwick"], False, "listed"),
    # without the gold, one or several distractors are a wrong binding as before
    ("Maren Osk and Iver Lund", ["Tobin Hale"], _SUSPECTS, False, "distractor"),
    # unanswerable items are unchanged: naming any candidate value (one or several) is a distractor
    ("Maren Osk or Tobin Hale", ["I don't know"], ["Maren Osk", "Tobin Hale"], True, "distractor"),
    ("I don't know", ["I don't know"], ["Maren Osk", "Tobin Hale"], True, "correct"),
])
def test_the_gold_among_other_candidates_is_listed(answer, golds, distractors, unans, expected):
    assert classify(answer, golds, distractors, unanswerable=unans) == expected


def test_listed_is_the_first_rule_and_a_failure_but_not_a_hallucination():
    from kvroute.metrics.hallucination import HALLUCINATIONS, OUTCOMES

    assert OUTCOMES == ("listed", "correct", "distractor", "abstained", "partial", "fabricated")
    assert "listed" not in HALLUCINATIONS and set(HALLUCINATIONS) == {"distractor", "fabricated"}


@dataclass
class _Prompt:
    n_context: int
    evidence_positions: list[int]
    answer_positions: list[int]


@dataclass
class _Out:
    last_attention: torch.Tensor
    generated_mass: dict = field(default_factory=dict)
    tokens: list = field(default_factory=list)


def _ctx(mask, attn, full_attn, share=None, kappa=2.0):
    T = mask.shape[-1]
    return CellContext(instance=None, prompt=_Prompt(T, [2, 3], [3]), mask=KeepMask(mask), output=_Out(attn),
                       full=_Out(full_attn), group_size=2, settings=MetricSettings(reach_kappa=kappa),
                       evidence_share=share)


def test_evidence_mass_and_direct_reachability():
    L, Hkv, H, T, Q = 1, 1, 2, 6, 2
    mask = torch.ones(L, Hkv, T, dtype=torch.bool)
    full = torch.zeros(L, H, T + Q)
    full[..., 3] = 0.6
    full[..., 7] = 0.4
    attn = full.clone()
    out = Accessibility().compute(_ctx(mask, attn, full))
    assert out["evidence_attention_mass"] == pytest.approx(0.6)
    assert out["answer_attention_mass"] == pytest.approx(0.6)
    assert out["reachable"] is True  # 0.6 > κ / (6 + 2) = 0.25
    mask[:, :, 2:4] = False  # evidence evicted: the engine's rows give it exactly zero
    attn = torch.zeros(L, H, T + Q)
    attn[..., 0] = 1.0
    out = Accessibility().compute(_ctx(mask, attn, full))
    assert out["evidence_attention_mass"] == 0.0 and out["evidence_attention_mass_full"] == pytest.approx(0.6)
    assert out["reachable"] is False


def test_routed_reachability_through_a_token_that_copied_the_evidence():
    L, Hkv, H, T, Q = 1, 1, 2, 6, 2
    mask = torch.ones(L, Hkv, T, dtype=torch.bool)
    mask[:, :, 2:4] = False  # evidence evicted everywhere: GER = 1
    attn = torch.zeros(L, H, T + Q)
    attn[..., 5] = 0.9  # the query reads token 5 ...
    attn[..., 6] = 0.1
    share = torch.zeros(L, T)
    share[0, 2:4] = 1.0
    full = attn.clone()
    assert RoutedReachability().compute(_ctx(mask, attn, full, share))["routed_reachable_uncalibrated"] is False
    share[0, 5] = 0.8  # ... which carries evidence content copied during the prefill
    out = RoutedReachability().compute(_ctx(mask, attn, full, share))
    assert out["routed_reachable_uncalibrated"] is True
    assert out["routed_evidence_mass"] == pytest.approx(0.9 * 0.8)
    # without null sources the calibrated verdict is undecided, never the raw rule's
    assert out["routed_reachable"] is None and out["routed_null_draws"] == 0


def test_rollout_on_a_hand_built_attention_layer():
    """One layer whose every query attends token 0 only: r¹ = ½ r⁰ + ½ r⁰[0]."""

    class Attn(torch.nn.Module):
        head_dim = 2
        scaling = 1.0

        def q_proj(self, x):
            return torch.zeros(x.shape[0], x.shape[1], 2)  # zero queries...

    T = 4
    keys = torch.zeros(1, 1, T, 2)
    cos, sin = torch.ones(1, T, 2), torch.zeros(1, T, 2)
    roll = EvidenceRollout([0], T)
    roll.on_layer(0, Attn(), torch.zeros(1, T, 2), keys, keys, {"position_embeddings": (cos, sin)})
    # zero queries -> uniform causal attention: row i averages r over 0..i
    expected = 0.5 * torch.tensor([1.0, 0, 0, 0]) + 0.5 * torch.tensor([1.0, 1 / 2, 1 / 3, 1 / 4])
    torch.testing.assert_close(roll.r[:, 0], expected)  # r: [T, 1 + n_null], column 0 the evidence
    assert roll.shares().shape == (1, T)


def test_every_metric_field_is_declared_in_the_record_schema():
    """A metric's fields are record fields: each is described in kvroute.records (a new field without its
    description fails here), and none is declared twice across the schema's groups."""
    from kvroute.metrics.base import METRICS
    from kvroute.records import (
        ALL_FIELDS,
        KEY_FIELDS,
        LAYER_FIELDS,
        METRIC_FIELDS,
        PRESS_FIELDS,
        STATUS_FIELDS,
        TASK_FIELDS,
        TIMING_FIELDS,
    )

    groups = [KEY_FIELDS, TASK_FIELDS, PRESS_FIELDS, STATUS_FIELDS, TIMING_FIELDS, METRIC_FIELDS, LAYER_FIELDS]
    assert sum(map(len, groups)) == len(ALL_FIELDS)
    for name, cls in METRICS.items():
        missing = [f for f in cls.fields if f not in ALL_FIELDS]
        assert not missing, f"metric {name} fills fields kvroute.records does not describe: {missing}"
