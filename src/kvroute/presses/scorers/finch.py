"""FINCH (kvpress FinchPress): SnapKV whose observation window is the question itself.

FINCH needs the question inside the compressed prefix (the question-aware regime). kvpress finds
the question with a delimiter token it adds to the vocabulary (``update_model_and_tokenizer``) and
drops from the input; kvroute knows where the question starts from the prompt
(``Prompt.question_window``), so neither the tokenizer nor the model's embeddings change. The scores
are kvpress's own (``FinchPress.score``: the window's attention onto the rest, normalised by how
many queries can see each key, the window itself kept).

kvpress re-rotates the kept keys by default (``rerotate_keys=True``): they move to new positions,
which a mask over the shared cache cannot express. kvroute's ``finch`` is ``FinchPress`` with
``rerotate_keys=False`` (kept entries stay where they are), the setting its equivalence is checked
against; the re-rotating variant is listed as out of scope. ``chunk_length`` is the selection's:
``finch+chunk[chunk_length=N,rescore=false]`` is ``FinchPress(chunk_length=N)``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from kvroute.presses.scorers.base import SCORERS, ScoreInputs
from kvroute.presses.scorers.kvpress_adapter import KvpressClass, KvpressScorer


@SCORERS.add
class FinchScorer(KvpressScorer):
    name: ClassVar[str] = "finch"
    description: ClassVar[str] = ("SnapKV whose window is the question inside the prefix (FINCH, kvpress FinchPress "
                                  "without key re-rotation); question-aware regime only.")
    press_cls: ClassVar[Any] = KvpressClass("FinchPress")
    needs_question_window: ClassVar[bool] = True

    def press_params(self) -> dict[str, Any]:
        return {**self.params, "rerotate_keys": False}  # fixed, not one of the user's parameters

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        return {"normalize_scores": True}

    def score(self, x: ScoreInputs, ratio: float) -> torch.Tensor:
        self.press.window_size = x.question_window
        return self.press.score(x.module, x.hidden_states, x.keys, x.values, x.attentions, x.kwargs)

    def kvpress_press(self, ratio: float, question_window: int = 0) -> Any:
        press = self.new_press(ratio)
        # kvpress learns the window from a delimiter token in the input; it is given here instead, and
        # the delimiter is set to an id no input holds, so kvpress's embedding hook leaves the input alone
        press.window_size = question_window
        press.delimiter_token_id = -1
        return press
