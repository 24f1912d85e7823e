"""The kvpress catalogue scorers (issue 15): parameter schemas, `presses list` metadata, preconditions.

No model: what is checked here happens when a press spec is built (``--dry-run``, ``kvroute run``
before loading). Their equivalence with kvpress is tests/reference/test_kvpress_equivalence.py.
"""

from __future__ import annotations

import pytest
import torch

from kvroute.errors import ConfigError, EngineError, KvrouteError
from kvroute.presses import SCORERS, build_press
from kvroute.presses.scorers import KvpressScorer
from kvroute.presses.scorers.kvpress_adapter import layer_seed

NEW = {  # name -> (kvpress class, ratio dependent, draws random numbers)
    "lagkv": ("LagKVPress", False, False),
    "leverage": ("LeverageScorePress", False, True),
    "cur": ("CURPress", False, True),
    "compactor": ("CompactorPress", True, True),
    "non_causal_attention": ("NonCausalAttnPress", False, False),
    "cap": ("CapPress", False, False),
    "kvpress_random": ("RandomPress", False, True),
}


@pytest.mark.parametrize("name", sorted(NEW))
def test_registered_with_its_metadata(name):
    cls = SCORERS.get(name)
    press_cls, ratio_dependent, random_draws = NEW[name]
    assert issubclass(cls, KvpressScorer) and cls.press_cls.__name__ == press_cls
    assert cls.ratio_dependent is ratio_dependent  # `presses list` shows "scored per ratio" from this
    assert cls.needs_attentions is False  # none keeps the N×N map (queries are recomputed per layer)
    assert cls.random_draws is random_draws
    assert "kvpress" in cls.description


def test_every_kvpress_parameter_is_typed_or_ranged():
    """Numbers have a range, strings their choices, None defaults a type; only booleans need nothing more."""
    missing = []
    for name, cls in SCORERS.items():
        if not issubclass(cls, KvpressScorer):
            continue
        for k, v in cls.parameters().items():
            p = cls.schema.get(k)
            if isinstance(v, bool):
                continue
            if p is None or (v is None and p.kind is None) or (isinstance(v, str) and p.choices is None):
                missing.append(f"{name}.{k}")
    assert not missing, missing


def test_private_fields_are_not_parameters():
    assert set(SCORERS.get("compactor").parameters()) == {"sink_size_start", "sink_size_end", "chunk_size",
                                                           "sketch_dimension", "blending"}


BAD = [
    ("lagkv[lag_size=1]", "lag_size"), ("lagkv[lag_size=0]", "lag_size"), ("lagkv[n_sink=-1]", "n_sink"),
    ("lagkv[cross_scoring=1]", "true or false"), ("lagkv[lag_size=2.5]", "integer"),
    ("leverage[sketch_dimension=0]", "sketch_dimension"), ("leverage[sketch_dimension=nan]", "integer"),
    ("cur[num_sinks=-1]", "num_sinks"), ("cur[local_window_size=0]", "local_window_size"),
    ("cur[leverage_type=keys]", "one of key, value, kv_avg, kv_product"), ("cur[leverage_type=1]", "one of"),
    ("cur[use_random_leverage=yes]", "true or false"),
    ("non_causal_attention[chunk_size=0]", "chunk_size"), ("non_causal_attention[chunk_size=-4]", "chunk_size"),
    ("compactor[blending=nan]", "finite"), ("compactor[blending=inf]", "finite"),
    ("compactor[blending=-0.1]", "blending"),
    ("compactor[blending=abc]", "number"), ("compactor[blending=true]", "number"),
    ("compactor[sink_size_start=-1]", "sink_size_start"), ("compactor[sink_size_end=-1]", "sink_size_end"),
    ("compactor[chunk_size=0]", "chunk_size"), ("compactor[sketch_dimension=0]", "sketch_dimension"),
    ("compactor[_leverage_press=1]", "unknown parameter"),
    ("cap[tau=-1]", "tau"), ("cap[tau=nan]", "finite"), ("cap[n_future_positions=0]", "n_future_positions"),
    ("cap[n_sink=-1]", "n_sink"), ("cap[epsilon=-1e-3]", "epsilon"), ("cap[epsilon=inf]", "finite"),
    ("kvpress_random[seed=-1]", "seed"), ("kvpress_random[seed=0.5]", "integer"),
    ("oracle[base=compactor[blending=nan]]", "finite"),
]


@pytest.mark.parametrize(("spec", "match"), BAD, ids=[s for s, _ in BAD])
def test_bad_parameters_are_refused_when_built(spec, match):
    with pytest.raises(KvrouteError) as e:
        build_press(spec)
    assert match.lower() in str(e.value).lower(), str(e.value)


GOOD = ["lagkv[lag_size=2,n_sink=0,cross_scoring=true]", "leverage[sketch_dimension=1]",
        "cur[leverage_type=value,num_sinks=0,local_window_size=1,use_random_leverage=true]",
        "non_causal_attention[chunk_size=1]", "compactor[blending=none]", "compactor[blending=0]",
        "compactor[blending=1,sink_size_start=0,sink_size_end=0]", "cap[tau=0,n_sink=0,epsilon=0]",
        "compactor+adakv", "lagkv+chunk[chunk_length=64]", "kvpress_random[seed=0]", "kvpress_random[seed=none]"]


@pytest.mark.parametrize("spec", GOOD)
def test_edge_parameters_are_accepted(spec):
    build_press(spec)


def test_dry_run_config_refuses_a_bad_catalogue_press(tmp_path):
    from kvroute.sweep import load_sweep_config

    cfg = tmp_path / "sweep.toml"
    cfg.write_text('name = "x"\nmodels = ["smollm2-135m"]\npresses = ["cap", "cur[leverage_type=foo]"]\n'
                   'ratios = [0.5]\n\n[[tasks]]\nfamily = "base"\nn = 1\n')
    with pytest.raises(ConfigError, match=r"presses\[1\].*leverage_type"):
        load_sweep_config(cfg)


def test_compactor_is_ratio_dependent_only_without_blending():
    assert build_press("compactor").scorer.ratio_dependent is True
    assert build_press("compactor[blending=0.35]").scorer.ratio_dependent is False
    assert build_press("compactor[blending=0.35]").name == "compactor[blending=0.35]+per_head"


@pytest.mark.parametrize(("spec", "need"), [("compactor", 14), ("compactor[sink_size_start=0,sink_size_end=0]", 2),
                                            ("cap", 5), ("cap[n_sink=0]", 1), ("leverage", 2),
                                            ("non_causal_attention", 2), ("lagkv", 1), ("cur", 1)])
def test_min_tokens(spec, need):
    scorer = build_press(spec).scorer
    assert scorer.min_tokens() == need
    scorer.check(need)
    if need > 1:
        with pytest.raises(EngineError, match=f"{scorer.name} needs more than"):
            scorer.check(need - 1)


def test_min_tokens_message_names_the_parameters():
    with pytest.raises(EngineError, match=r"sink_size_start\+sink_size_end\+1=13 context tokens, this context has 10"):
        build_press("compactor").scorer.check(10)
    with pytest.raises(EngineError, match=r"'snapkv\[window_size=10\]'"):  # the existing message, unchanged
        build_press("snapkv").scorer.check(40)


def test_layer_seed_is_the_random_scorers_rule():
    assert layer_seed(0, 3) == 3 and layer_seed(2, 1) == 2 * 100_003 + 1


def test_random_scorer_leaves_the_callers_generator_alone():
    """The adapter seeds inside fork_rng: scoring does not move torch's global generator."""
    from kvroute.presses.scorers import ScoreInputs

    class _Stub(torch.nn.Module):  # just what LeverageScorePress reads: k_proj, head_dim, the config
        def __init__(self):
            super().__init__()
            self.k_proj = torch.nn.Linear(8, 8, bias=False)
            self.head_dim = 4
            self.layer_idx = 0

    scorer = build_press("leverage[sketch_dimension=2]").scorer
    module = _Stub()
    hidden = torch.randn(1, 12, 8)
    x = ScoreInputs(module, 0, hidden, torch.zeros(1, 2, 12, 4), torch.zeros(1, 2, 12, 4), {"hidden_states": hidden})
    torch.manual_seed(5)
    before = torch.get_rng_state()
    a = scorer.score(x, 0.5)
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(6)
    assert torch.equal(scorer.score(x, 0.5), a)  # the draw depends on (seed, layer) only
    x.layer_idx = 1
    assert not torch.equal(scorer.score(x, 0.5), a)
