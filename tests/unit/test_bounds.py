"""kvroute.bounds: the checks every value read from a user's file or command line passes at the door."""

from __future__ import annotations

import json

import pytest

from kvroute.bounds import MAX_DEPTH, MAX_SEED, check_seed, loads_json, text_problem, value_problem
from kvroute.errors import ConfigError


def _nested(depth: int) -> list:
    v: list = []
    for _ in range(depth - 1):
        v = [v]
    return v


def test_depth_is_counted_in_containers_and_the_limit_is_inclusive():
    assert value_problem(_nested(MAX_DEPTH)) is None
    assert "nested more than" in (value_problem(_nested(MAX_DEPTH + 1)) or "")
    assert value_problem({"a": {"b": [1, "x", None]}}) is None


def test_a_lone_surrogate_is_found_in_values_and_keys_but_a_pair_is_text():
    assert text_problem("\U0001f600 ok") is None  # a character outside the BMP, one code point in Python
    assert "lone surrogate" in (text_problem("a\ud800") or "")
    assert "string" in (value_problem({"k": ["ok", "\udfff"]}) or "")
    assert "key" in (value_problem({"\ud83d": 1}) or "")
    assert json.loads('"\\ud83d\\ude00"') == "\U0001f600" and loads_json('"\\ud83d\\ude00"') == "\U0001f600"


def test_loads_json_refuses_what_json_loads_cannot_or_should_not_give():
    with pytest.raises(ValueError, match="nested more than"):
        loads_json("[" * 100_000 + "]" * 100_000)  # json.loads itself raises RecursionError here
    with pytest.raises(ValueError, match="lone surrogate"):
        loads_json('{"q": "\\ud800"}')
    with pytest.raises(json.JSONDecodeError):
        loads_json("{not json")
    assert loads_json('{"a": [1, 2]}') == {"a": [1, 2]}


@pytest.mark.parametrize("seed", [0, 1, MAX_SEED])
def test_seeds_in_range_pass(seed):
    assert check_seed(seed) == seed


@pytest.mark.parametrize("seed", [-1, MAX_SEED + 1, 10**23, True, 1.0, "3"])
def test_seeds_out_of_range_or_not_integers_fail_naming_the_option(seed):
    with pytest.raises(ConfigError, match="--seed must be an integer from 0 to"):
        check_seed(seed, "--seed")
