"""Figure plumbing shared by the report's figure modules: panels, colours, PNG bytes.

Figures are built on :class:`matplotlib.figure.Figure` directly (no pyplot), which renders with
the Agg canvas and never touches a GUI backend or the global backend choice of the caller.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence

from matplotlib.axes import Axes
from matplotlib.figure import Figure

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")
MAX_PANELS = 12


def panels(n: int, *, ncols: int | None = None, width: float = 4.6, height: float = 3.5,
           sharey: bool = False) -> tuple[Figure, list[Axes]]:
    """A constrained-layout figure with ``n`` axes in a grid (unused cells removed)."""
    n = max(1, n)
    ncols = ncols or (2 if n == 4 else min(n, 3))
    nrows = math.ceil(n / ncols)
    # at least 9 in wide so a one-panel figure still has room for its title
    fig = Figure(figsize=(max(width * ncols, 9.0), height * nrows), layout="constrained", dpi=100)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharey=sharey).ravel().tolist()
    for ax in axes[n:]:
        fig.delaxes(ax)
    return fig, axes[:n]


def color_map(names: Sequence[object]) -> dict[object, str]:
    """A stable colour per name (in the order given)."""
    return {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(names)}


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def data_uri(png: bytes) -> str:
    """A ``data:`` URI embedding PNG bytes (the report references nothing outside itself)."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def plain_label(text: object) -> str:
    """Text safe for matplotlib: ``$`` would start mathtext, so escape it."""
    return str(text).replace("$", r"\$")


def short(text: object, n: int = 40) -> str:
    s = plain_label(text)
    return s if len(s) <= n else s[: n - 1] + "…"
