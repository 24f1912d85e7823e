"""Survival of one instance's evidence tokens across layers and KV heads, from a KeepMask array.

Keep-masks come from the engine (bool ``[L, Hkv, T]``, True = the KV entry of context token t is
kept for KV head h of layer ℓ); the records do not hold them, so the report takes one as input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from kvroute.analysis.common import AnalysisError
from kvroute.report.render import panels, plain_label, short


@dataclass(frozen=True)
class SurvivalExample:
    """One instance's keep-mask and evidence positions, validated on construction.

    ``keep``: bool ``[L, Hkv, T]``; ``evidence``: context positions of T_ev; ``tokens``: optional
    token strings for the evidence positions' labels (length T, or one per evidence position);
    ``answer``: optional positions of T_ans (marked ★); ``title``: e.g. the instance id and press.
    """

    keep: np.ndarray
    evidence: Sequence[int]
    tokens: Sequence[str] | None = None
    answer: Sequence[int] = ()
    title: str = ""

    def __post_init__(self) -> None:
        keep = np.asarray(self.keep)
        if keep.ndim != 3:
            raise AnalysisError(f"keep must be a bool array [layers, kv_heads, context_tokens], got shape {keep.shape}")
        if keep.dtype != bool:
            if not np.isin(keep, (0, 1)).all():
                raise AnalysisError("keep must hold booleans (or 0/1)")
            keep = keep.astype(bool)
        object.__setattr__(self, "keep", keep)
        T = keep.shape[2]
        ev = [int(p) for p in self.evidence]
        if not ev:
            raise AnalysisError("the survival heatmap needs at least one evidence position")
        bad = [p for p in (*ev, *self.answer) if not 0 <= int(p) < T]
        if bad:
            raise AnalysisError(f"positions {bad[:5]} are outside the context (T = {T})")
        object.__setattr__(self, "evidence", ev)
        if self.tokens is not None and len(self.tokens) not in (T, len(ev)):
            raise AnalysisError(f"tokens must have T = {T} or {len(ev)} entries, got {len(self.tokens)}")

    def labels(self) -> list[str]:
        """Tick labels for the evidence positions (★ marks answer tokens)."""
        ans = set(int(a) for a in self.answer)
        if self.tokens is None:
            base = [str(p) for p in self.evidence]
        elif len(self.tokens) == len(self.evidence) and len(self.tokens) != self.keep.shape[2]:
            base = list(self.tokens)
        else:
            base = [self.tokens[p] for p in self.evidence]
        return [("★" if p in ans else "") + short(repr(t)[1:-1] if self.tokens is not None else t, 14)
                for p, t in zip(self.evidence, base, strict=True)]


def survival_figure(example: SurvivalExample) -> Figure:
    """Two panels: (a) layer × KV head share of evidence tokens kept; (b) layer × evidence token,
    the number of KV heads keeping it — 0 (red) means the token is globally evicted at that layer."""
    keep = example.keep[:, :, example.evidence]  # [L, Hkv, E]
    L, Hkv, E = keep.shape
    share = keep.mean(axis=2)  # [L, Hkv]
    heads = keep.sum(axis=1)  # [L, E]
    fig, (ax_a, ax_b) = panels(2, width=max(4.5, 0.35 * E + 3), height=max(3.5, 0.18 * L + 1.5), ncols=2)
    im = ax_a.imshow(share, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    ax_a.set_xlabel("KV head")
    ax_a.set_ylabel("layer")
    ax_a.set_xticks(range(Hkv))
    ax_a.set_title("(a) share of evidence tokens kept", fontsize=9)
    fig.colorbar(im, ax=ax_a, shrink=0.8)
    colors = ["#d62728"] + [str(c) for c in np.linspace(0.85, 0.15, Hkv).round(2)]  # 0 heads red, then greys
    im_b = ax_b.imshow(heads, aspect="auto", cmap=ListedColormap(colors), vmin=-0.5, vmax=Hkv + 0.5,
                       interpolation="nearest")
    ax_b.set_xticks(range(E))
    ax_b.set_xticklabels([plain_label(t) for t in example.labels()], rotation=70, fontsize=7, ha="right")
    ax_b.set_ylabel("layer")
    ax_b.set_title("(b) KV heads keeping each evidence token (red = globally evicted)", fontsize=9)
    cb = fig.colorbar(im_b, ax=ax_b, shrink=0.8, ticks=range(Hkv + 1))
    cb.set_label("heads keeping it")
    ger = float((heads[:, [i for i, p in enumerate(example.evidence) if p in set(example.answer)]] == 0).mean()) \
        if example.answer else None
    sub = f" — GER on the answer tokens = {ger:.2f}" if ger is not None else ""
    fig.suptitle(plain_label(f"Evidence-token survival {example.title}".strip() + sub), fontsize=10)
    return fig


def survival_heatmap(keep: np.ndarray, evidence: Sequence[int], *, tokens: Sequence[str] | None = None,
                     answer: Sequence[int] = (), title: str = "") -> Figure:
    """:func:`survival_figure` straight from arrays: ``keep`` bool ``[L, Hkv, T]`` and evidence positions."""
    return survival_figure(SurvivalExample(keep, evidence, tokens=tokens, answer=answer, title=title))


def save_survival(path: str | Path, example: SurvivalExample) -> Path:
    """Write a keep-mask example (bit-packed) to ``path`` (``.npz``), e.g. ``RUN_DIR/masks/NAME.npz``."""
    from kvroute.files import atomic_write

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(p, "wb") as f:  # a killed writer leaves no half-written .npz for the report to read
        np.savez_compressed(f, keep=np.packbits(example.keep), shape=np.array(example.keep.shape),
                            evidence=np.array(example.evidence), answer=np.array(list(example.answer), dtype=int),
                            tokens=np.array(list(example.tokens or []), dtype=str), title=np.array(example.title))
    return p


def load_survival(path: str | Path) -> SurvivalExample:
    """Read a keep-mask example written by :func:`save_survival`."""
    z = np.load(path)
    shape = tuple(int(x) for x in z["shape"])
    keep = np.unpackbits(z["keep"])[: int(np.prod(shape))].reshape(shape).astype(bool)
    tokens = [str(t) for t in z["tokens"]] or None
    return SurvivalExample(keep, [int(x) for x in z["evidence"]], tokens=tokens,
                           answer=[int(x) for x in z["answer"]], title=str(z["title"]))
