"""Restoration maps on tiny models (issue 48): the map's controls, a planted route, and resuming from the store.

The planted model is a tiny random llama whose attention outputs are zeroed everywhere except one KV head's
group of query heads in one layer (``o_proj`` columns): the context reaches the answer through that (layer,
KV head) slot and nowhere else, so restoring the answer in any other slot cannot change a logit, and the map's
one non-zero entry must be that slot (its largest in magnitude: a random model's route has no sign). A slot
condition that leaked into other layers or heads (the mutation
``test_the_planted_test_fails_when_a_slot_leaks_into_other_layers`` makes) would light them up too.
"""

import html
import json

import pytest
import torch

from kvroute.analysis.restore_map import averaged_map, load_maps, minimal_sizes, restore_map_finding, set_agreement
from kvroute.engine import Cell, Engine
from kvroute.models import tiny_model
from kvroute.presses.restore import Restore
from kvroute.report.build import build_run_report
from kvroute.restore_map import MAP_DIR, RestoreMap, all_slots, map_from_records, restore_map, slot_condition
from kvroute.runner import run_instance
from kvroute.settings import RunSettings
from kvroute.tasks import TaskSpec, generate_tasks

SETTINGS = RunSettings(max_new_tokens=4, metrics=("utilization",))
PRESS = "anti_oracle[base=knorm]"  # evicts the evidence (the answer with it) first: the answer is gone
ROUTE = (1, 1)  # the planted model's only route: layer 1, KV head 1


def _instance(lm):
    return next(i for i in generate_tasks(TaskSpec("base", n=3, seed=3, target_tokens=200), lm.tokenizer)
                if not i.unanswerable)


@pytest.fixture(scope="module")
def tiny():
    lm = tiny_model("llama", seed=0)
    return lm, Engine(lm, SETTINGS.decode_settings()), _instance(lm)


def _planted(route=ROUTE, scale=4.0):
    """A tiny llama whose only path from the context to the answer is the ``route`` (layer, KV head)."""
    lm = tiny_model("llama", seed=0)
    info = lm.info
    D, G = info.head_dim, info.group_size
    layer, kv = route
    with torch.no_grad():
        for i, block in enumerate(lm.model.model.layers):
            w = block.self_attn.o_proj.weight  # [hidden, H * D]: query head q's output is columns q*D:(q+1)*D
            keep = torch.zeros(w.shape[1], dtype=torch.bool)
            if i == layer:
                keep[kv * G * D:(kv + 1) * G * D] = True  # the G query heads KV head kv serves
            w.mul_(keep.to(w.dtype) * scale)
    return lm


@pytest.fixture(scope="module")
def planted():
    lm = _planted()
    return lm, Engine(lm, SETTINGS.decode_settings()), _instance(lm)


def test_every_slot_at_once_is_the_answer_restoration_and_no_slot_is_the_compressed_cell(tiny):
    lm, engine, inst = tiny
    m = restore_map(engine, inst, PRESS, 0.9, settings=SETTINGS, minimal=False)
    assert m.checks == {"every_slot_is_whole_target": True, "no_slot_is_compressed": True}
    assert m.every_slot["answer"] == m.whole["answer"] and m.no_slot["answer"] == m.compressed["answer"]
    assert m.every_slot["gold_logprob"] == pytest.approx(m.whole["gold_logprob"], abs=1e-4)
    assert m.no_slot["gold_logprob"] == pytest.approx(m.compressed["gold_logprob"], abs=1e-4)
    # the normalisation: the compressed cell is 0 and the full cache 1, by construction of the effect
    assert m.compressed["gold_logprob"] != pytest.approx(m.full["gold_logprob"])
    assert tuple(m.effect.shape) == (lm.info.num_layers, lm.info.num_kv_heads)
    assert list(zip(m.frame["layer"], m.frame["kv_head"], strict=True)) == all_slots(*m.effect.shape)
    assert torch.equal(torch.as_tensor(m.frame["effect"].to_numpy(), dtype=torch.float32),
                       m.effect.flatten())


def test_the_same_tokens_decoded_directly_for_the_controls(tiny):
    """Tokens, not only texts: every slot == answer, no slot == the press's own mask (engine outputs)."""
    lm, engine, inst = tiny
    from kvroute.runner import instance_prompt

    prompt = instance_prompt(engine, inst, regime="agnostic", settings=SETTINGS)
    ans = [p for p in prompt.answer_positions if p < prompt.n_context]
    L, Hkv = lm.info.num_layers, lm.info.num_kv_heads
    cells = [Cell(PRESS, 0.9), Cell(PRESS, 0.9, "answer"), Cell(PRESS, 0.9, slot_condition("answer", [])),
             Cell(PRESS, 0.9, slot_condition("answer", all_slots(L, Hkv)))]
    res = engine.run(prompt, cells, answer=ans, evidence=prompt.evidence_positions)
    comp, whole, none, every = res.outputs
    assert torch.equal(res.masks[3].mask, res.masks[1].mask) and torch.equal(res.masks[2].mask, res.masks[0].mask)
    assert every.tokens == whole.tokens and none.tokens == comp.tokens


def test_a_planted_route_is_the_maps_only_nonzero_slot(planted):
    lm, engine, inst = planted
    m = restore_map(engine, inst, PRESS, 0.9, settings=SETTINGS, minimal=False)
    effect = m.effect
    assert not torch.isnan(effect).any()
    # random weights give the route no sign (the full cache is no better at the gold than the compressed cell on a
    # random model), so the map's largest entry is taken in magnitude
    assert divmod(int(effect.abs().argmax()), effect.shape[1]) == ROUTE
    assert effect[ROUTE].abs() > 0.05
    others = effect.clone()
    others[ROUTE] = 0.0
    assert others.abs().max() < 1e-3  # no other slot reaches the answer: restoring there changes nothing
    # the route alone gives what the whole answer restoration gives
    lp_whole = m.whole["gold_logprob"]
    assert m.frame.set_index(["layer", "kv_head"]).loc[ROUTE, "gold_logprob"] == pytest.approx(lp_whole, abs=1e-3)


def test_the_planted_test_fails_when_a_slot_leaks_into_other_layers(planted, monkeypatch):
    """The mutation: a slot condition that restores its KV head in every layer lights up the route's head in
    every layer, so the planted test's 'only non-zero slot' assertion must fail."""
    lm, engine, inst = planted
    real = Restore._apply_slots

    def leaky(self, mask, *a, **kw):
        if self.slots and len(self.slots) == 1:
            _, h = self.slots[0]
            leaked = Restore(self.target, heads=(h,), span=self.span)
            return leaked.apply(mask, *a[:2], seed=a[2], consensus=a[3], distractors=a[4])
        return real(self, mask, *a, **kw)

    monkeypatch.setattr(Restore, "_apply_slots", leaky)
    with pytest.raises(AssertionError):
        test_a_planted_route_is_the_maps_only_nonzero_slot(planted)


def test_the_minimal_set_is_the_shortest_greedy_prefix_that_repairs():
    """Hand-built records: slots (1, 0) > (0, 1) > … by effect; the prefix of two repairs, that of one (the single
    slot's own cell) does not."""
    recs = [{"press": "none", "ratio": 0.0, "restore": None, "gold_logprob": -1.0, "outcome": "correct",
             "answer": "a", "instance_id": "i"},
            {"press": "p", "ratio": 0.9, "restore": None, "gold_logprob": -5.0, "outcome": "fabricated", "answer": "b",
             "instance_id": "i"}]
    lp = {(0, 0): -4.5, (0, 1): -3.0, (1, 0): -2.0, (1, 1): -5.0}
    for sl, v in lp.items():
        recs.append({"press": "p", "ratio": 0.9, "restore": slot_condition("answer", [sl]), "gold_logprob": v,
                     "outcome": "fabricated", "answer": "b"})
    every = [(0, 0), (0, 1), (1, 0), (1, 1)]
    for slots, ok in (([(0, 1), (1, 0)], True), (every, True)):
        recs.append({"press": "p", "ratio": 0.9, "restore": slot_condition("answer", slots), "gold_logprob": -1.0,
                     "outcome": "correct" if ok else "fabricated", "answer": "a" if ok else "b"})
    m = map_from_records(recs)
    assert m.effect.tolist() == [[0.125, 0.5], [0.75, 0.0]]
    assert m.order == [(1, 0), (0, 1), (0, 0), (1, 1)]
    assert m.minimal == [(0, 1), (1, 0)] and m.minimal_record["answer"] == "a"
    # without the prefix of two, the search has not got that far: the every-slot cell (the last prefix) that
    # repairs is not yet the minimal set
    unsearched = [r for r in recs if r.get("restore") != slot_condition("answer", [(0, 1), (1, 0)])]
    assert map_from_records(unsearched).minimal is None


def test_a_rerun_reads_every_cell_from_the_store(tiny, tmp_path):
    lm, engine, inst = tiny
    first = restore_map(engine, inst, PRESS, 0.9, settings=SETTINGS, store=tmp_path, minimal=False)
    again = restore_map(engine, inst, PRESS, 0.9, settings=SETTINGS, store=tmp_path, minimal=False)
    assert first.computed == 5 + lm.info.num_layers * lm.info.num_kv_heads and again.computed == 0
    assert torch.equal(first.effect, again.effect)
    direct = run_instance(engine, inst, [Cell(PRESS, 0.9)], settings=SETTINGS)[0]
    assert first.compressed["answer"] == direct["answer"]


def test_a_run_report_draws_its_maps_with_the_finding_written_by_the_code(tiny, tmp_path, monkeypatch):
    """The whole report of a run with a map store: section 5c holds the finding sentence and the map figure.

    The report maps failures only (full cache right, compressed cell not); a random tiny model answers nothing
    right, so its map is labelled a failure here — everything else is the real path from the store to the page."""
    monkeypatch.setattr(RestoreMap, "failure", property(lambda self: True))
    lm, engine, inst = tiny
    recs = run_instance(engine, inst, [Cell("none", 0.0), Cell(PRESS, 0.5), Cell(PRESS, 0.9)], settings=SETTINGS)
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs), encoding="utf-8")
    restore_map(engine, inst, PRESS, 0.9, settings=SETTINGS, store=tmp_path / MAP_DIR, minimal=False)
    maps = load_maps(tmp_path / MAP_DIR)
    assert len(maps) == 1
    sentence = restore_map_finding(PRESS, 0.9, averaged_map(maps), minimal_sizes(maps),
                                   set_agreement([m.minimal for m in maps if m.minimal is not None],
                                                 lm.info.num_layers * lm.info.num_kv_heads))
    page = html.unescape(build_run_report(path, tmp_path / "report").read_text(encoding="utf-8"))
    assert "5c. Restoration maps" in page and 'id="fig-restore-map"' in page
    assert sentence in " ".join(page.split())
