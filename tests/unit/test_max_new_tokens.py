"""One default for the answer budget (``max_new_tokens``), named everywhere, and one check with one error type."""

import inspect

import pytest

from kvroute.config import DEFAULT_MAX_NEW_TOKENS, check_max_new_tokens
from kvroute.errors import ConfigError


def _default(fn, name="max_new_tokens"):
    return inspect.signature(fn).parameters[name].default


def test_every_default_is_the_one_default():
    from kvroute.cli.presses import presses_check
    from kvroute.cli.run import ask, run, ticket
    from kvroute.engine.decode import DecodeSettings
    from kvroute.engine.generate import greedy_answer, greedy_generate
    from kvroute.engine.reference import kvpress_answer
    from kvroute.settings import RunSettings
    from kvroute.tickets import TicketSettings

    found = {"RunSettings": RunSettings().max_new_tokens, "DecodeSettings": DecodeSettings().max_new_tokens,
             "TicketSettings": TicketSettings().max_new_tokens, "greedy_answer": _default(greedy_answer),
             "greedy_generate": _default(greedy_generate), "kvpress_answer": _default(kvpress_answer),
             "ask": _default(ask), "run": _default(run), "ticket": _default(ticket),
             "presses check": _default(presses_check)}
    assert set(found.values()) == {DEFAULT_MAX_NEW_TOKENS}, found


@pytest.mark.parametrize("bad", [0, -1, 2.5, "8", True, None])
def test_a_bad_budget_is_a_config_error_naming_where_it_came_from(bad):
    with pytest.raises(ConfigError, match="--max-new-tokens must be a whole number"):
        check_max_new_tokens(bad, "--max-new-tokens")


@pytest.mark.parametrize("make", ["RunSettings", "DecodeSettings", "TicketSettings"])
def test_settings_objects_refuse_a_bad_budget_with_the_same_check(make):
    from kvroute.engine.decode import DecodeSettings
    from kvroute.settings import RunSettings
    from kvroute.tickets import TicketSettings

    cls = {"RunSettings": RunSettings, "DecodeSettings": DecodeSettings, "TicketSettings": TicketSettings}[make]
    with pytest.raises(ConfigError, match="max_new_tokens must be a whole number of new tokens, at least 1; got 0"):
        cls(max_new_tokens=0)
    assert check_max_new_tokens(3) == 3
