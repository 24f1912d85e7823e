"""Writing a found ticket into a run directory: one line in tickets.jsonl, its mask and its heatmap."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from kvroute.analysis.tickets import TICKETS_FILE
from kvroute.files import atomic_write, safe_name, write_bytes
from kvroute.tickets.search import Ticket


def ticket_stem(model: str, instance_id: str) -> str:
    """The file stem of a ticket's mask and heatmap: ``{model folder name}-{instance id}``, made safe."""
    return safe_name(f"{Path(str(model)).name}-{instance_id}")


def save_ticket(run_dir: str | Path, model: str, target: str, family: str, ticket: Ticket) -> dict[str, Any]:
    """Append ``ticket`` to ``RUN_DIR/tickets.jsonl``; its bit-packed mask and heatmap go to ``RUN_DIR/tickets/``.

    Files are named ``{model}-{instance}`` (through :func:`kvroute.files.safe_name`, so no id can write
    outside ``RUN_DIR/tickets/``) so that several models can share a run directory; they are written
    atomically. Returns the line written.
    """
    from kvroute.report.heatmap import survival_heatmap
    from kvroute.report.render import png_bytes

    run_dir = Path(run_dir)
    folder = run_dir / "tickets"
    folder.mkdir(parents=True, exist_ok=True)
    s = ticket.summary()
    stem = ticket_stem(model, ticket.instance_id)
    mask = ticket.mask.mask.cpu().numpy()
    with atomic_write(folder / f"{stem}.npz", "wb") as f:
        np.savez_compressed(f, keep=np.packbits(mask), shape=np.array(mask.shape),
                            evidence=np.array(ticket.evidence, dtype=np.int64))
    if ticket.evidence:
        fig = survival_heatmap(mask, ticket.evidence, answer=ticket.answer_positions,
                               title=f"{model}: ticket for {ticket.instance_id} "
                                     f"({100 * s['fraction']:.2f}% of the cache)")
        write_bytes(folder / f"{stem}.png", png_bytes(fig))
    line = {"model": model, "target": target, "family": family, **s}
    text = json.dumps(line) + "\n"
    with (run_dir / TICKETS_FILE).open("a") as f:  # one line per write: an append is all or nothing in practice
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return line


def load_ticket_mask(path: str | Path) -> np.ndarray:
    """The bool ``[L, Hkv, T]`` keep-mask of a ticket saved by :func:`save_ticket`."""
    with np.load(path) as z:
        shape = tuple(int(x) for x in z["shape"])
        return np.unpackbits(z["keep"], count=int(np.prod(shape))).astype(bool).reshape(shape)
