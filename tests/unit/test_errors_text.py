"""The small text helpers of kvroute.errors that one-line messages are built from."""

from __future__ import annotations

import pytest

from kvroute.errors import plural_of, with_article


@pytest.mark.parametrize("noun,expected", [("int", "an int"), ("list", "a list"), ("dict", "a dict"),
                                           ("str", "a str"), ("Exception", "an Exception"), ("NoneType", "a NoneType")])
def test_with_article(noun, expected):
    assert with_article(noun) == expected


@pytest.mark.parametrize("noun,expected", [("family", "families"), ("box", "boxes"), ("day", "days"),
                                           ("press", "presses"), ("task family", "task families")])
def test_plural_of(noun, expected):
    assert plural_of(noun) == expected
