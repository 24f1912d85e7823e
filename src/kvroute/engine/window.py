"""The context-window checks every prompt goes through (``run``, ``sweep``, ``ticket``, ``ask``).

:func:`check_chars` is the cheap one, before tokenising: no token of the vocabulary is longer than
``max_token_chars`` characters, so a text of ``n`` characters has at least ``n / max_token_chars``
tokens; a text whose lower bound already exceeds the window is refused without tokenising it (a
50 MB task line used to be tokenised in full — 16 GB, two minutes — before being refused).
:func:`check_tokens` is the exact check on the tokenised prompt.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from kvroute.errors import PromptTooLongError

if TYPE_CHECKING:
    from kvroute.models.loading import LoadedModel

_LONGEST: dict[int, int] = {}


def max_token_chars(tokenizer: Any) -> int:
    """The longest vocabulary entry (added tokens included), in characters; cached per tokenizer."""
    key = id(tokenizer)
    if key not in _LONGEST:
        try:
            vocab = tokenizer.get_vocab()
            _LONGEST[key] = max((len(t) for t in vocab), default=0) or 1
        except Exception:  # a tokenizer without a vocabulary: no bound (check_tokens still applies)
            _LONGEST[key] = 0
    return _LONGEST[key]


def check_chars(lm: LoadedModel, n_chars: int, max_new_tokens: int) -> None:
    """Raise :class:`PromptTooLongError` when ``n_chars`` of text cannot fit ``lm``'s window, without tokenising."""
    window = lm.info.context_window
    longest = max_token_chars(lm.tokenizer)
    if not window or not longest:
        return
    at_least = math.ceil(n_chars / longest)
    if at_least + max_new_tokens > window:
        raise PromptTooLongError(
            f"a prompt of {n_chars:,} characters has at least {at_least:,} tokens (no token of {lm.name} is longer "
            f"than {longest} characters), more than its context window of {window:,} with {max_new_tokens} new "
            "tokens; shorten the context or use a model with a longer window")


def check_tokens(lm: LoadedModel, n_prompt_tokens: int, max_new_tokens: int) -> None:
    """Raise :class:`PromptTooLongError` when the tokenised prompt plus the answer exceeds ``lm``'s window."""
    window = lm.info.context_window
    if window and n_prompt_tokens + max_new_tokens > window:
        raise PromptTooLongError(
            f"prompt of {n_prompt_tokens} tokens plus {max_new_tokens} new tokens exceeds {lm.name}'s context "
            f"window of {window}; shorten the context or use a model with a longer window")
