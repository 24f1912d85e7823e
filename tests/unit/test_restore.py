"""Restore conditions: parsing, the entries they put back (hand-built masks), their refusals, and the
restoration table on hand-built records."""

import pandas as pd
import pytest
import torch

from kvroute.analysis.restoration import restoration_table
from kvroute.errors import ConfigError, EngineError
from kvroute.presses import KeepMask
from kvroute.presses.restore import Restore


@pytest.mark.parametrize("spec", ["answer", "evidence", "random", "distractor", "consensus@layers:middle",
                                  "answer@layers:2-4", "answer@layers:late",
                                  "evidence@layers:early@heads:0,1", "answer@heads:1", "answer@heads:retrieval",
                                  "evidence@layers:late@heads:retrieval", "answer@slots:3.1,4.0",
                                  "evidence@slots:none", "span:2-5", "span:0-3@layers:1-2@heads:1",
                                  "span:4-4@slots:0.1"])
def test_conditions_round_trip(spec):
    assert str(Restore.parse(spec)) == spec


@pytest.mark.parametrize("spec, needle", [
    ("anser", "unknown target 'anser'.*did you mean 'answer'"),
    ("answer@layers:5-2", "run backwards; write 2-5"),
    ("answer@layers:first", "FIRST-LAST"),
    ("answer@heads:a,b", "KV head numbers"),
    ("answer@heads:-1", "start at 0"),
    ("answer@layers:1-2@layers:3-4", "each at most once"),
    ("answer@tokens:3", "is not @layers"),
    ("answer@slots:3-1", "slot '3-1' is not LAYER.KV_HEAD"),
    ("answer@slots:3.1,x", "slot 'x' is not LAYER.KV_HEAD"),
    ("answer@slots:3.1@layers:1-2", "without @layers and @heads"),
    ("answer@heads:0@slots:3.1", "without @layers and @heads"),
    ("answer@slots:1.0@slots:2.0", "each at most once"),
    ("span", "span:FIRST-LAST"),
    ("span:9-2", "runs backwards; write span:2-9"),
    ("spam:1-2", "did you mean 'span'"),
])
def test_malformed_conditions_are_refused_naming_the_part(spec, needle):
    with pytest.raises(ConfigError, match=needle):
        Restore.parse(spec)


def _mask(L=6, H=2, T=10):
    return KeepMask(torch.zeros(L, H, T, dtype=torch.bool), "hand", 0.9)


def test_answer_restores_exactly_its_tokens_in_the_named_layers_and_heads():
    m = Restore.parse("answer@layers:1-2@heads:1").apply(_mask(), answer=[3, 4, 99], evidence=[7])
    expected = torch.zeros(6, 2, 10, dtype=torch.bool)
    expected[1:3, 1, 3:5] = True  # position 99 lies outside the context and is ignored
    assert torch.equal(m.mask, expected) and (m.press, m.ratio) == ("hand", 0.9)
    ev = Restore.parse("evidence").apply(_mask(), answer=[3], evidence=[7, 8])
    assert ev.mask[:, :, [3, 7, 8]].all() and int(ev.mask.sum()) == 6 * 2 * 3  # evidence includes the answer
    assert not _mask().mask.any()  # the input mask is not changed


def test_layer_bands_are_thirds():
    for band, layers in (("early", [0, 1]), ("middle", [2, 3]), ("late", [4, 5])):
        m = Restore.parse(f"answer@layers:{band}").apply(_mask(), answer=[0], evidence=[])
        assert m.mask[:, 0, 0].nonzero().flatten().tolist() == layers


def test_random_restores_as_many_other_tokens_reproducibly():
    r = Restore.parse("random")
    a = r.apply(_mask(), answer=[2, 5], evidence=[], seed=3).mask[0, 0].nonzero().flatten().tolist()
    b = r.apply(_mask(), answer=[2, 5], evidence=[], seed=3).mask[0, 0].nonzero().flatten().tolist()
    c = {tuple(r.apply(_mask(), answer=[2, 5], evidence=[], seed=s).mask[0, 0].nonzero().flatten().tolist())
         for s in range(20)}
    assert a == b and len(a) == 2 and not set(a) & {2, 5} and len(c) > 1


def test_distractor_restores_as_many_distractor_tokens_as_the_answer_has():
    r = Restore.parse("distractor@layers:early")
    occ = [[6, 7], [8], [9, 2]]  # occurrences of distractor values; 2 is an answer token and never restored
    picks = {tuple(r.apply(_mask(), answer=[2, 3], evidence=[], seed=s, distractors=occ).mask[0, 0].nonzero()
                   .flatten().tolist()) for s in range(20)}
    assert all(len(p) == 2 and set(p) <= {6, 7, 8, 9} for p in picks) and len(picks) > 1
    assert (6, 7) in picks  # a whole occurrence when it fits
    m = r.apply(_mask(), answer=[2, 3], evidence=[], seed=0, distractors=occ).mask
    assert not m[2:].any()  # only the named layers
    short = r.apply(_mask(), answer=[2, 3, 4], evidence=[], distractors=[[8]]).mask[0, 0].nonzero().flatten().tolist()
    assert len(short) == 3 and 8 in short and not set(short) & {2, 3, 4}  # topped up to the answer's size
    with pytest.raises(EngineError, match="no distractor tokens"):
        r.apply(_mask(), answer=[2, 3], evidence=[], distractors=[[2]])


@pytest.mark.parametrize("spec, answer, needle", [
    ("answer@layers:4-9", [1], "has 6 layers \\(0-5\\), not 9"),
    ("answer@heads:0,2", [1], "has 2 KV heads"),
    ("answer", [], "no answer tokens in the context"),
    ("random", [], "no answer tokens"),
    ("evidence", [], "no evidence tokens"),
])
def test_what_the_model_or_instance_lacks_is_an_engine_error(spec, answer, needle):
    with pytest.raises(EngineError, match=needle):
        Restore.parse(spec).apply(_mask(), answer=answer, evidence=[])


def test_retrieval_heads_restore_exactly_their_layer_and_kv_head_pairs():
    from kvroute.presses.restore import kv_pairs

    # query heads (layer, h) of a model with 4 query heads over 2 KV heads: h // 2 is the KV head
    pairs = kv_pairs([(0, 0), (0, 1), (3, 3), (5, 2)], num_heads=4, num_kv_heads=2)
    assert pairs == [(0, 0), (3, 1), (5, 1)]
    m = Restore.parse("answer@heads:retrieval").apply(_mask(), answer=[3, 4], evidence=[], retrieval=pairs)
    expected = torch.zeros(6, 2, 10, dtype=torch.bool)
    for layer, h in pairs:
        expected[layer, h, [3, 4]] = True
    assert torch.equal(m.mask, expected)
    late = Restore.parse("answer@layers:late@heads:retrieval").apply(_mask(), answer=[3], evidence=[], retrieval=pairs)
    assert late.mask.nonzero().tolist() == [[5, 1, 3]]  # layers 4-5 only


@pytest.mark.parametrize("retrieval, spec, needle", [
    (None, "answer@heads:retrieval", "no retrieval heads are known"),
    ([], "answer@heads:retrieval", "no retrieval heads \\(none scores"),
    ([(0, 0)], "answer@layers:late@heads:retrieval", "no retrieval heads in these layers"),
    ([(9, 0)], "answer@heads:retrieval", "outside this model's 6 layers × 2 KV heads"),
    ([(0, 0)], "random@heads:retrieval", None),
])
def test_retrieval_heads_the_model_lacks_are_an_engine_error(retrieval, spec, needle):
    cond = Restore.parse(spec)
    if needle is None:  # the null in the same heads: as many random tokens, in the retrieval heads only
        m = cond.apply(_mask(), answer=[3, 4], evidence=[], retrieval=retrieval)
        assert int(m.mask.sum()) == 2 and m.mask[0, 0].sum() == 2 and not m.mask[0, 0, [3, 4]].any()
        return
    with pytest.raises(EngineError, match=needle):
        cond.apply(_mask(), answer=[3], evidence=[], retrieval=retrieval)


def test_kv_pairs_refuse_heads_that_do_not_split_into_groups():
    from kvroute.presses.restore import kv_pairs

    with pytest.raises(EngineError, match="do not split"):
        kv_pairs([(0, 0)], num_heads=6, num_kv_heads=4)


def _records():
    rows = []
    for i in range(10):
        inst = f"i{i}"
        rows.append(dict(model="m", instance_id=inst, press="none", ratio=0.0, restore=None, regime="agnostic", seed=0,
                         outcome="correct", ger_all_layers=0.0, evidence="located"))
        erased = i < 6  # six erasures, four retained failures, all failing at 0.9
        rows.append(dict(model="m", instance_id=inst, press="p", ratio=0.9, restore=None, regime="agnostic", seed=0,
                         outcome="fabricated", ger_all_layers=1.0 if erased else 0.5, evidence="located"))
        # restore=answer repairs the six erasures and one retained failure; random repairs none
        rows.append(dict(model="m", instance_id=inst, press="p", ratio=0.9, restore="answer", regime="agnostic",
                         seed=0, outcome="correct" if erased or i == 6 else "fabricated", ger_all_layers=0.0,
                         evidence="located"))
        rows.append(dict(model="m", instance_id=inst, press="p", ratio=0.9, restore="random", regime="agnostic",
                         seed=0, outcome="fabricated", ger_all_layers=1.0, evidence="located"))
    return pd.DataFrame(rows)


def test_the_restoration_table_counts_repairs_per_failure_class():
    t = restoration_table(_records()).set_index(["restore", "class"])
    assert (t.loc[("answer", "erasure"), "failures"], t.loc[("answer", "erasure"), "repaired"]) == (6, 6)
    assert (t.loc[("answer", "retained"), "failures"], t.loc[("answer", "retained"), "repaired"]) == (4, 1)
    assert (t.loc[("answer", "all"), "failures"], t.loc[("answer", "all"), "repaired"]) == (10, 7)
    # an instance whose full cache is wrong too: its failures are not compression's, and are left out
    df = _records()
    df.loc[(df["instance_id"] == "i9") & (df["press"] == "none"), "outcome"] = "fabricated"
    t9 = restoration_table(df).set_index(["restore", "class"])
    assert (t9.loc[("answer", "retained"), "failures"], t9.loc[("answer", "all"), "failures"]) == (3, 9)
    assert t.loc[("random", "all"), "repaired"] == 0 and t.loc[("random", "all"), "high"] < 0.35
    lo, hi = t.loc[("answer", "all"), ["low", "high"]]
    assert lo < 0.7 < hi
    assert restoration_table(_records().query("restore.isna()")).empty


def test_a_restored_cell_that_lists_the_candidates_is_not_a_repair():
    from kvroute.analysis.decomposition import failure_mask
    from kvroute.analysis.restoration import pooled_restoration, restoration_pairs
    from kvroute.metrics.hallucination import classify

    gold, suspects = ["Tobin Hale"], ["Maren Osk", "Iver Lund"]
    listed = classify("Maren Osk, Iver Lund and Tobin Hale", gold, suspects)
    repaired = classify("Tobin Hale", gold, suspects)
    df = _records()
    answer = df["restore"].eq("answer")
    # of the seven cells restore=answer repaired, two erasures (i0, i1) and the retained one (i6) now hedge
    df.loc[answer & df["instance_id"].isin(["i0", "i1", "i6"]), "outcome"] = listed
    df.loc[answer & df["instance_id"].isin(["i2", "i3", "i4", "i5"]), "outcome"] = repaired
    t = restoration_table(df).set_index(["restore", "class"])
    assert tuple(t.loc[("answer", "erasure"), ["failures", "repaired", "listed"]]) == (6, 4, 2)
    assert tuple(t.loc[("answer", "retained"), ["failures", "repaired", "listed"]]) == (4, 0, 1)
    assert tuple(t.loc[("answer", "all"), ["failures", "repaired", "listed"]]) == (10, 4, 3)
    assert t.loc[("answer", "all"), "share"] == pytest.approx(0.4) and t.loc[("random", "all"), "listed"] == 0
    pooled = pooled_restoration(df).set_index("restore")
    assert tuple(pooled.loc["answer", ["repaired", "listed"]]) == (4, 3)
    assert not restoration_pairs(df).query("listed")["repaired"].any()
    # a compressed cell that lists is a failure in its own right: restoring the answer that fixes it repairs it
    base = df["restore"].isna() & df["press"].eq("p") & df["instance_id"].eq("i7")
    df.loc[base, "outcome"] = listed
    assert failure_mask(df[base]).all()
    df.loc[answer & df["instance_id"].eq("i7"), "outcome"] = repaired
    t = restoration_table(df).set_index(["restore", "class"])
    assert tuple(t.loc[("answer", "all"), ["failures", "repaired", "listed"]]) == (10, 5, 3)
    # a full cache that lists is not right: that instance's failures are not compression's, and are left out
    df.loc[df["press"].eq("none") & df["instance_id"].eq("i9"), "outcome"] = listed
    assert restoration_table(df).set_index(["restore", "class"]).loc[("answer", "all"), "failures"] == 9


def test_consensus_positions_are_each_layers_most_shared_argmax_after_the_sinks():
    from kvroute.presses.restore import consensus_positions

    rows = torch.full((2, 3, 12), 0.01)
    rows[0, :, 1] = 0.9  # a sink: every head's raw argmax, skipped
    rows[0, 0, 5], rows[0, 1, 5], rows[0, 2, 7] = 0.5, 0.4, 0.6  # after the sinks: 5, 5, 7 -> 5
    rows[1, 0, 9], rows[1, 1, 6], rows[1, 2, 6] = 0.5, 0.5, 0.5
    rows[1, :, 11] = 0.99  # beyond the context (a question token): not a context position
    assert consensus_positions(rows, T=10) == [5, 6]
    m = Restore.parse("consensus").apply(_mask(L=2, T=10), answer=[], evidence=[], consensus=[5, 6])
    assert m.mask.nonzero().tolist() == [[0, 0, 5], [0, 1, 5], [1, 0, 6], [1, 1, 6]]
    with pytest.raises(EngineError, match="consensus positions were not computed"):
        Restore.parse("consensus").apply(_mask(L=2, T=10), answer=[], evidence=[])
    with pytest.raises(EngineError, match="none after the first 4"):
        consensus_positions(rows[..., :4], T=4)


def test_pooled_restoration_counts_an_instances_pairs_as_correlated():
    from kvroute.analysis.common import wilson
    from kvroute.analysis.restoration import pooled_restoration

    one = _records()
    two = pd.concat([one, one[one["press"] == "p"].assign(press="q")], ignore_index=True)  # the same pairs twice
    t = pooled_restoration(two).set_index("restore")
    assert (t.loc["answer", "failures"], t.loc["answer", "repaired"], t.loc["answer", "n_instances"]) == (20, 14, 10)
    assert t.loc["answer", "share"] == pytest.approx(0.7) and t.loc["random", "repaired"] == 0
    # each instance's two pairs agree: the 20 pairs carry the information of 10, not 20
    assert tuple(t.loc["answer", ["low", "high"]]) == pytest.approx(wilson(7, 10))
    assert tuple(t.loc["random", ["low", "high"]]) == pytest.approx(wilson(0, 10))  # all alike: one per instance
    per_press = pooled_restoration(two, by=["press", "restore"]).set_index(["press", "restore"])
    table = restoration_table(one).set_index(["restore", "class"])
    assert per_press.loc[("p", "answer"), "repaired"] == table.loc[("answer", "all"), "repaired"]
    assert tuple(per_press.loc[("p", "answer"), ["low", "high"]]) == pytest.approx(
        tuple(table.loc[("answer", "all"), ["low", "high"]]))  # one pair per instance: plain Wilson
    assert pooled_restoration(one.query("restore.isna()")).empty


def test_clustered_wilson_lies_between_the_pairs_and_the_instances():
    from kvroute.analysis.common import clustered_wilson, wilson

    # independent-looking clusters (within-cluster variation as large as between): Wilson on the pairs
    assert clustered_wilson([1, 1, 1, 1, 1, 1], [2] * 6) == pytest.approx(wilson(6, 12))
    # clusters that disagree wholesale: Wilson on the clusters
    assert clustered_wilson([2, 2, 2, 0, 0, 0], [2] * 6) == pytest.approx(wilson(3, 6))
    lo, hi = clustered_wilson([2, 1, 2, 0, 1, 0], [2] * 6)
    (p_lo, p_hi), (c_lo, c_hi) = wilson(6, 12), wilson(3, 6)
    assert c_lo <= lo <= p_lo and p_hi <= hi <= c_hi


@pytest.mark.parametrize("clusters, size, a, b", [(7, 4, 1.4, 0.6), (30, 3, 0.9, 0.1)])
def test_clustered_wilson_covers_a_planted_share_where_wilson_on_the_pairs_does_not(clusters, size, a, b):
    """Planted truth: instances draw their own success rate from Beta(a, b) (intra-instance correlation 1/3 and
    1/2), each gives ``size`` correlated pairs; the clustered interval keeps ~95% coverage of the mean a/(a+b),
    Wilson on the pairs falls well short."""
    import numpy as np

    from kvroute.analysis.common import clustered_wilson, wilson

    rng, truth, reps = np.random.default_rng(0), a / (a + b), 1000
    covered = naive = 0
    for _ in range(reps):
        y = rng.binomial(size, rng.beta(a, b, clusters))
        lo, hi = clustered_wilson(y, [size] * clusters)
        covered += lo <= truth <= hi
        lo, hi = wilson(int(y.sum()), clusters * size)
        naive += lo <= truth <= hi
    assert covered / reps >= 0.90 and naive / reps <= covered / reps - 0.05


def test_slots_restore_exactly_their_layer_and_kv_head_pairs():
    """Slot (1, 0) and (4, 1) get the answer back; every other (layer, KV head) and every other token is untouched."""
    m = Restore.parse("answer@slots:4.1,1.0,1.0").apply(_mask(), answer=[2, 3, 11], evidence=[1, 2, 3])
    want = torch.zeros(6, 2, 10, dtype=torch.bool)
    want[1, 0, [2, 3]] = True
    want[4, 1, [2, 3]] = True
    assert torch.equal(m.mask, want)


def test_one_slot_equals_the_one_layer_one_head_condition_and_all_slots_equal_the_whole_target():
    g = torch.Generator().manual_seed(0)
    base = KeepMask(torch.rand(6, 2, 10, generator=g) > 0.7, "hand", 0.7)
    kw = dict(answer=[2, 3], evidence=[1, 2, 3, 7])
    for target in ("answer", "evidence", "span:5-8"):
        one = Restore.parse(f"{target}@slots:3.1").apply(base, **kw)
        assert torch.equal(one.mask, Restore.parse(f"{target}@layers:3-3@heads:1").apply(base, **kw).mask)
        every = ",".join(f"{a}.{b}" for a in range(6) for b in range(2))
        assert torch.equal(Restore.parse(f"{target}@slots:{every}").apply(base, **kw).mask,
                           Restore.parse(target).apply(base, **kw).mask)
    none = Restore.parse("answer@slots:none").apply(base, **kw)
    assert torch.equal(none.mask, base.mask) and none.mask is not base.mask


def test_a_span_restores_its_positions_and_a_span_past_the_context_is_an_engine_error():
    m = Restore.parse("span:6-8@heads:0").apply(_mask(), answer=[], evidence=[])
    want = torch.zeros(6, 2, 10, dtype=torch.bool)
    want[:, 0, 6:9] = True
    assert torch.equal(m.mask, want)
    with pytest.raises(EngineError, match="context has 10 tokens"):
        Restore.parse("span:6-10").apply(_mask(), answer=[], evidence=[])


@pytest.mark.parametrize("spec", ["answer@slots:6.0", "answer@slots:2.2"])
def test_a_slot_the_model_lacks_is_an_engine_error(spec):
    with pytest.raises(EngineError, match="outside this model's 6 layers × 2 KV heads"):
        Restore.parse(spec).apply(_mask(), answer=[2], evidence=[2])
