"""Writing a found ticket into a run directory: one line in tickets.jsonl, its mask and its heatmap."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from kvroute.analysis.tickets import TICKETS_FILE
from kvroute.tickets.search import Ticket


def save_ticket(run_dir: str | Path, model: str, target: str, family: str, ticket: Ticket) -> dict[str, Any]:
    """Append ``ticket`` to ``RUN_DIR/tickets.jsonl``; its bit-packed mask and heatmap go to ``RUN_DIR/tickets/``.

    Files are named ``{model}-{instance}`` so that several models can share a run directory. Returns
    the line written.
    """
    from kvroute.report.heatmap import survival_heatmap
    from kvroute.report.render import png_bytes

    run_dir = Path(run_dir)
    folder = run_dir / "tickets"
    folder.mkdir(parents=True, exist_ok=True)
    s = ticket.summary()
    stem = f"{Path(model).name}-{ticket.instance_id}"
    mask = ticket.mask.mask.cpu().numpy()
    np.savez_compressed(folder / f"{stem}.npz", keep=np.packbits(mask), shape=np.array(mask.shape),
                        evidence=np.array(ticket.evidence, dtype=np.int64))
    if ticket.evidence:
        fig = survival_heatmap(mask, ticket.evidence, answer=ticket.answer_positions,
                               title=f"{model}: ticket for {ticket.instance_id} ({100 * s['fraction']:.2f}% of the cache)")
        (folder / f"{stem}.png").write_bytes(png_bytes(fig))
    line = {"model": model, "target": target, "family": family, **s}
    with (run_dir / TICKETS_FILE).open("a") as f:
        f.write(json.dumps(line) + "\n")
    return line


def load_ticket_mask(path: str | Path) -> np.ndarray:
    """The bool ``[L, Hkv, T]`` keep-mask of a ticket saved by :func:`save_ticket`."""
    with np.load(path) as z:
        shape = tuple(int(x) for x in z["shape"])
        return np.unpackbits(z["keep"], count=int(np.prod(shape))).astype(bool).reshape(shape)
