"""Routed reachability on a tiny random model through the runner (issue 14): the mask controls must order
oracle ≥ random ≥ anti_oracle, and a model whose attention singles nothing out must not read reachable at
the full cache more often than a test at 5% allows for a handful of cells."""

import pytest

from kvroute.engine import Cell, Engine
from kvroute.models import tiny_model
from kvroute.runner import RunSettings, run_instance
from kvroute.tasks import TaskSpec, generate_tasks

PRESSES = ("none", "oracle[base=knorm]", "random", "anti_oracle[base=knorm]")


@pytest.fixture(scope="module")
def records():
    lm = tiny_model("llama", seed=0)
    settings = RunSettings(max_new_tokens=2, metrics=("retention", "accessibility", "routes"))
    engine = Engine(lm, settings.decode_settings())
    cells = [Cell("none", 0.0)] + [Cell(p, 0.9) for p in PRESSES[1:]]
    out = []
    for fam in ("niah", "base"):  # padded to ~1.2k tokens: room for 19 disjoint null copies of the evidence
        for inst in generate_tasks(TaskSpec(fam, n=4, seed=3, target_tokens=1200), lm.tokenizer):
            if not inst.unanswerable:
                out += run_instance(engine, inst, cells, settings=settings, seed=0)
    return out


def _share(records, press):
    xs = [r["routed_reachable"] for r in records if r["press"] == press]
    assert xs and all(x is not None for x in xs)  # long documents: every cell decided
    return sum(xs) / len(xs)


def test_mask_controls_order_oracle_over_random_over_anti_oracle(records):
    share = {p: _share(records, p) for p in PRESSES}
    print("\nrouted_reachable share, tiny llama at α = 0.9:", share)
    assert share["oracle[base=knorm]"] >= 0.75
    assert share["oracle[base=knorm]"] >= share["random"] >= share["anti_oracle[base=knorm]"]
    assert share["anti_oracle[base=knorm]"] == 0.0
    assert share["none"] <= 0.25  # random weights: no retrieval head
    oracle = [r for r in records if r["press"] == "oracle[base=knorm]"]
    assert all(r["routed_kind"] in ("direct", "rollout") and 1 <= r["routed_layer"] <= 3 for r in oracle)
    assert all(r["routed_null_draws"] == 19 for r in records)
