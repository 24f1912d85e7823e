"""Grid expansion, cell keys, resume filtering and Ray shards (no model, no task generation)."""

from types import SimpleNamespace

import pytest

from kvroute.engine import NO_PRESS, Cell
from kvroute.sweep.config import sweep_config_from_mapping
from kvroute.sweep.grid import cell_key, count_cells, expand, grid_cells, model_id, pending, shards


def config(**over):
    data = {"models": ["smollm2-135m", "qwen2.5-0.5b"], "tasks": [{"family": "base", "n": 3}],
            "presses": ["knorm", "snapkv+adakv"], "ratios": [0, 0.5, 0.9], "regimes": ["agnostic", "aware"],
            "seeds": [0, 1], **over}
    return sweep_config_from_mapping(data)


def instances(n, prefix="i"):
    return [SimpleNamespace(id=f"{prefix}{k}") for k in range(n)]


def test_one_baseline_cell_then_presses_times_nonzero_ratios():
    cells = grid_cells(config())
    assert [c for c, _ in cells] == [Cell(NO_PRESS, 0.0), Cell("knorm", 0.5), Cell("knorm", 0.9),
                                     Cell("snapkv+adakv", 0.5), Cell("snapkv+adakv", 0.9)]
    assert [canon for _, canon in cells] == ["none", "knorm+per_head", "knorm+per_head", "snapkv+adakv",
                                             "snapkv+adakv"]
    assert all(c.ratio > 0 for c, _ in grid_cells(config(ratios=[0.5])))


def test_expand_counts_orders_and_keys_every_cell_uniquely():
    cfg = config()
    tasks = {"smollm2-135m": instances(3), "qwen2.5-0.5b": instances(3)}
    units = expand(cfg, tasks)
    assert len(units) == 2 * 2 * 2 * 3  # models × seeds × regimes × instances
    assert count_cells(units) == len(units) * 5
    keys = [k for u in units for k in u.keys]
    assert len(set(keys)) == len(keys)
    assert [u.model for u in units[:12]] == ["smollm2-135m"] * 12  # model outermost: loaded once
    assert expand(cfg, tasks)[7].keys == units[7].keys  # deterministic


def test_cell_key_is_a_content_hash_of_its_parts():
    args = ("m|auto", "abc", "knorm+per_head", 0.5, "agnostic", 0, "s1")
    k = cell_key(*args)
    assert len(k) == 32 and k == cell_key(*args)
    for i, other in enumerate(("m|bfloat16", "abd", "snapkv+per_head", 0.25, "aware", 1, "s2")):
        changed = list(args)
        changed[i] = other
        assert cell_key(*changed) != k, i
    assert cell_key(*args[:3], 0, *args[4:]) == cell_key(*args[:3], 0.0, *args[4:])


def test_press_spelling_does_not_change_keys():
    a = expand(config(presses=["knorm"]), {"smollm2-135m": instances(1), "qwen2.5-0.5b": instances(1)})
    b = expand(config(presses=["knorm+per_head"]), {"smollm2-135m": instances(1), "qwen2.5-0.5b": instances(1)})
    assert [u.keys for u in a] == [u.keys for u in b]
    assert a[0].cells[1].press == "knorm" and b[0].cells[1].press == "knorm+per_head"  # records keep the spelling


def test_model_dtype_is_part_of_the_key():
    cfg = sweep_config_from_mapping({"models": [{"name": "smollm2-135m", "dtype": "bfloat16"}],
                                     "tasks": [{"family": "base"}], "presses": ["knorm"], "ratios": [0.5]})
    assert model_id(cfg.models[0]) == "smollm2-135m|bfloat16"


def test_pending_drops_done_cells_and_empty_units():
    units = expand(config(), {"smollm2-135m": instances(2), "qwen2.5-0.5b": instances(2)})
    done = set(units[0].keys) | {units[1].keys[0], units[1].keys[3]}
    todo = pending(units, done)
    assert len(todo) == len(units) - 1
    assert todo[0].keys == tuple(k for k in units[1].keys if k not in done)
    assert [(c.press, c.ratio) for c in todo[0].cells] == [("knorm", 0.5), ("knorm", 0.9), ("snapkv+adakv", 0.9)]
    assert count_cells(todo) == count_cells(units) - 7
    assert pending(units, {k for u in units for k in u.keys}) == []


@pytest.mark.parametrize("per_shard", [1, 2, 5])
def test_shards_group_instances_per_model_and_cover_every_unit_once(per_shard):
    units = expand(config(), {"smollm2-135m": instances(5), "qwen2.5-0.5b": instances(3, "q")})
    out = shards(units, per_shard)
    flat = [u for s in out for u in s]
    assert sorted(map(id, flat)) == sorted(map(id, units))
    for s in out:
        assert len({u.model for u in s}) == 1
        assert len({u.instance.id for u in s}) <= per_shard
        ids = {u.instance.id for u in s}
        assert sum(1 for u in units if u.instance.id in ids and u.model == s[0].model) == len(s)  # all regimes/seeds
    models = [s[0].model for s in out]
    assert models == sorted(models, key=models.index)  # each model's shards contiguous


def _conversation(c, turns=3):
    return [SimpleNamespace(id=f"c{c}t{t}", context=f"context {c}", meta={"conversation": f"c{c}", "turn": t + 1})
            for t in range(turns)]


def test_with_a_history_a_conversation_is_one_unit_with_a_key_per_turn_and_cell():
    cfg = config(regimes=["agnostic"], seeds=[0], decoding={"history": "own"})
    tasks = {m: _conversation(0) + _conversation(1) for m in ("smollm2-135m", "qwen2.5-0.5b")}
    units = expand(cfg, tasks)
    assert len(units) == 2 * 2  # models × conversations
    u = units[0]
    assert [i.id for i in u.instances] == ["c0t0", "c0t1", "c0t2"] and len(u) == 3 * 5 == count_cells([u])
    assert u.keys[5] == cell_key(model_id(cfg.models[0]), "c0t1", "none", 0.0, "agnostic", 0, cfg.settings_hash)
    # without a history every instance is its own unit, under other keys (the settings hash differs)
    plain = expand(config(regimes=["agnostic"], seeds=[0]), tasks)
    assert len(plain) == 2 * 6 and not set(u.keys) & {k for p in plain for k in p.keys}


def test_a_conversation_resumes_the_cells_with_a_missing_turn_in_every_turn():
    cfg = config(regimes=["agnostic"], seeds=[0], decoding={"history": "gold"})
    u = expand(cfg, {"smollm2-135m": _conversation(0), "qwen2.5-0.5b": []})[0]
    n = len(u.cells)
    done = set(u.keys) - {u.keys[2 * n + 1]}  # turn 3 of the second cell is missing
    (left,) = pending([u], done)
    assert left.cells == (u.cells[1],) and left.keys == tuple(u.keys[t * n + 1] for t in range(3))
    assert pending([u], set(u.keys)) == []


@pytest.mark.parametrize("over, needle", [
    ({"decoding": {"history": "onw"}}, "did you mean 'own'"),
    ({"decoding": {"history": "own"}}, "regimes = \\[\"agnostic\"\\] only"),
])
def test_bad_history_settings_fail_in_one_line(over, needle):
    from kvroute.errors import ConfigError

    with pytest.raises(ConfigError, match=needle):
        config(**over)


@pytest.mark.parametrize("history", [None, "gold"])
def test_the_dry_run_sizes_conversations_as_the_plan_expands_them(history):
    from kvroute.sweep.driver import plan_sweep, size_sweep

    cfg = config(tasks=[{"family": "base", "n": 2, "questions": 3}], regimes=["agnostic"],
                 **({"decoding": {"history": history}} if history else {}))
    sized, plan = size_sweep(cfg), plan_sweep(cfg)
    assert (sized["cells"], sized["units"]) == (plan.cells, len(plan.units))
    assert sized["units"] == 2 * 2 * (2 if history else 6)  # models × seeds × (conversations or instances)
    assert sized["questions_per_unit"] == (3 if history else 1)
