"""Presses whose learned weights kvpress downloads from a model hub, given here as local folders.

``qfilter[weights=FOLDER]`` (QFilterPress), ``kvzap[weights=FOLDER,model_type=...]`` (KVzapPress) and
``expected_attention_stats[stats_folder=FOLDER]`` (ExpectedAttentionStatsPress), on the tiny random
Llama and Qwen2 with random weights of the right shape written by kvpress's own classes
(``save_pretrained``). Each is checked against kvpress's pipeline as tests/reference checks every
registered scorer: generated token ids, text, and first-token logits within 1e-4, at ratios
0.25/0.5/0.75/0.9. Every test runs with the network cut (sockets refuse to connect), so a hub
download anywhere, kvpress's side included, fails the test instead of passing on a lucky cache.
"""

from __future__ import annotations

import socket
from functools import cache
from pathlib import Path

import pytest
import torch
from kvpress import QFilterPress

from kvroute.engine import Cell, DecodeSettings, Engine
from kvroute.engine.check import compare_prompt
from kvroute.engine.reference import kvpress_logits, kvpress_prompt_ids
from kvroute.errors import ConfigError
from kvroute.models import tiny_model
from kvroute.presses import SCORERS, build_press
from kvroute.presses.scorers.kvpress_adapter import seeded_kvpress_layers
from tests.kvpress_prompt import Prompt

CONTEXT = ("Alice Morgan was born in Ferravik in 1987 and works as a glassblower for the Northwind Company. "
           "Her brother lives in Quenby; his manager is Tobias Vell, who was born on 12 March 1961. ") * 3
QUESTION = "Question: where was Alice born? Answer briefly."
RATIOS = (0.25, 0.5, 0.75, 0.9)
MAX_NEW_TOKENS = 8
SEED = 0

#: the registered scorers that read learned weights from a folder, and the parameter naming it
WEIGHT_SCORERS = {"qfilter": "weights", "kvzap": "weights", "expected_attention_stats": "stats_folder"}
# case -> (scorer, extra parameters, selection): each scorer with its defaults, kvzap's two surrogates, and
# kvpress wrapper presses, which call the inner press's post_init_from_model themselves
CASES = {
    "qfilter": ("qfilter", "", ""),
    "kvzap-mlp": ("kvzap", "model_type=mlp", ""),
    "kvzap-linear": ("kvzap", "model_type=linear", ""),
    "expected_attention_stats": ("expected_attention_stats", "", ""),
    "expected_attention_stats-variant": ("expected_attention_stats",
                                         "n_sink=2,use_covariance=false,n_future_positions=64", ""),
    "qfilter+chunk": ("qfilter", "", "+chunk[chunk_length=64]"),
    "kvzap+block": ("kvzap", "model_type=linear", "+block[block_size=16]"),
}


@pytest.fixture(autouse=True)
def _network_cut(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError("the network is cut in this test: nothing may be downloaded")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@cache
def _lm(arch, layers=3, heads=4, kv_heads=2):
    return tiny_model(arch, seed=0, layers=layers, heads=heads, kv_heads=min(kv_heads, heads))


def write_weights(scorer: str, lm, folder: Path, *, seed: int = 0, model_type: str = "mlp") -> Path:
    """Random weights of ``scorer`` shaped for ``lm``, saved to ``folder`` by kvpress's class; returns ``folder``."""
    return SCORERS.get(scorer).save_random(lm.model, folder, seed=seed, model_type=model_type)


def _spec(case: str, lm, tmp_path: Path, seed: int = 0) -> str:
    scorer, extra, selection = CASES[case]
    model_type = "linear" if "model_type=linear" in extra else "mlp"
    folder = write_weights(scorer, lm, tmp_path / f"{case}-{seed}", seed=seed, model_type=model_type)
    params = ",".join(p for p in (f"{WEIGHT_SCORERS[scorer]}={folder}", extra) if p)
    return f"{scorer}[{params}]{selection}"


def _prompt(lm) -> Prompt:
    c, q = kvpress_prompt_ids(lm.tokenizer, CONTEXT, QUESTION)
    return Prompt(c, q, CONTEXT, QUESTION)


# equivalence with kvpress ---------------------------------------------------------------------------------
@pytest.mark.reference
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_matches_kvpress_with_local_weights(arch, case, tmp_path):
    """Token ids, text and first-token logits as kvpress's pipeline, the same folder on both sides."""
    lm = _lm(arch)
    spec = _spec(case, lm, tmp_path)
    prompt = _prompt(lm)
    engine = Engine(lm, DecodeSettings(max_new_tokens=MAX_NEW_TOKENS, keep_logits=True))
    res = compare_prompt(engine, prompt, [Cell(spec, r) for r in RATIOS], seed=SEED)
    for cmp in res.cells:
        assert cmp.comparable, cmp.describe()
        with seeded_kvpress_layers(lm.model, SEED):
            ref = kvpress_logits(lm, prompt.context_ids, prompt.question_ids, cmp.cell.press, cmp.cell.ratio)
        torch.testing.assert_close(cmp.ours.logits[0], ref[-1], atol=1e-4, rtol=0,
                                   msg=lambda m, cell=cmp.cell: f"{cell}: {m}")
        assert cmp.agrees, cmp.describe()


@pytest.mark.parametrize("scorer", sorted(WEIGHT_SCORERS))
def test_the_folder_decides_what_is_kept(scorer, tmp_path):
    """Two folders of different random weights keep different entries: the weights are what is scored."""
    lm = _lm("llama")
    case = "kvzap-mlp" if scorer == "kvzap" else scorer
    specs = [_spec(case, lm, tmp_path, seed=s) for s in (0, 1)]
    res = Engine(lm, DecodeSettings(max_new_tokens=1)).run(_prompt(lm), [Cell(s, 0.5) for s in specs])
    assert not torch.equal(res.masks[0].mask, res.masks[1].mask)


@pytest.mark.parametrize("scorer", sorted(WEIGHT_SCORERS))
def test_kvpress_press_holds_the_weights_and_never_reaches_the_hub(scorer, tmp_path):
    """The kvpress press comes loaded; its own post_init_from_model (the hub loader) would need the network."""
    lm = _lm("qwen2")
    press = build_press(_spec("kvzap-mlp" if scorer == "kvzap" else scorer, lm, tmp_path)).scorer.kvpress_press(0.5)
    press.post_init_from_model(lm.model)  # the instance's: no network (it is cut)
    if isinstance(press, QFilterPress):
        assert press.q_filters.shape == (lm.info.num_layers, lm.info.num_kv_heads, lm.info.head_dim)
        with pytest.raises(Exception):  # noqa: B017  (whatever huggingface_hub raises without a network)
            type(press).post_init_from_model(press, lm.model)  # kvpress's own: downloads nthngdy/<model>_qfilt


# bad input --------------------------------------------------------------------------------------------------
def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("scorer", sorted(WEIGHT_SCORERS))
def test_without_its_folder_the_press_is_refused_at_build_time(scorer):
    with pytest.raises(ConfigError) as err:
        build_press(scorer)
    msg = _one_line(err)
    assert f"give {WEIGHT_SCORERS[scorer]}=FOLDER" in msg and "does not download" in msg, msg


@pytest.mark.parametrize("scorer", sorted(WEIGHT_SCORERS))
def test_a_folder_that_does_not_exist_is_refused_at_build_time(scorer, tmp_path):
    with pytest.raises(ConfigError) as err:
        build_press(f"{scorer}[{WEIGHT_SCORERS[scorer]}={tmp_path / 'nowhere'}]")
    assert "does not exist" in _one_line(err)


@pytest.mark.parametrize("scorer", sorted(WEIGHT_SCORERS))
def test_a_folder_that_does_not_load_is_refused(scorer, tmp_path):
    """An empty folder, and one holding another press's weights: refused when the model is set up."""
    lm = _lm("llama")
    (tmp_path / "empty").mkdir()
    other = "qfilter" if scorer != "qfilter" else "expected_attention_stats"
    write_weights(other, lm, tmp_path / "other")
    for folder, says in ((tmp_path / "empty", "no config.json"), (tmp_path / "other", "does not load")):
        press = build_press(f"{scorer}[{WEIGHT_SCORERS[scorer]}={folder}]")
        with pytest.raises(ConfigError) as err:
            press.scorer.setup(lm.model)
        assert says in _one_line(err) and str(folder) in str(err.value)


def test_kvzap_model_type_must_be_the_folders(tmp_path):
    lm = _lm("llama")
    folder = write_weights("kvzap", lm, tmp_path / "linear", model_type="linear")
    with pytest.raises(ConfigError) as err:
        build_press(f"kvzap[weights={folder}]").scorer.setup(lm.model)  # model_type defaults to mlp
    assert "give model_type=linear" in _one_line(err)


# (scorer, the model it is run on): fewer layers for each; fewer KV heads where the weights are per KV head,
# fewer query heads (so head_dim 32) where they are per query head or per head_dim
SHAPE_CASES = [*((s, {"layers": 2}) for s in sorted(WEIGHT_SCORERS)), ("qfilter", {"kv_heads": 1}),
               ("kvzap", {"kv_heads": 1}), ("qfilter", {"heads": 2}), ("expected_attention_stats", {"heads": 2})]


@pytest.mark.parametrize("scorer, other", SHAPE_CASES)
def test_weights_for_another_model_are_refused_naming_both_shapes(scorer, other, tmp_path):
    """Weights written for the tiny Llama (3 layers, 4 heads, 2 KV heads, head_dim 16), run on another shape."""
    folder = write_weights(scorer, _lm("llama"), tmp_path / "w")
    lm = _lm("llama", **other)
    spec = f"{scorer}[{WEIGHT_SCORERS[scorer]}={folder}]"
    with pytest.raises(ConfigError) as err:
        Engine(lm).run(_prompt(lm), [Cell(spec, 0.5)]).raise_for_errors()
    msg = _one_line(err)
    have, need = msg.split("have shape ")[1].split(", this model needs ")
    assert have != need and "layers=3" in have and "[" in need, msg
    with pytest.raises(ConfigError, match="this model needs"):  # kvpress's side refuses the same way
        build_press(spec).scorer.kvpress_press(0.5).post_init_from_model(lm.model)
