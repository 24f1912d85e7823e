"""The Hugging Face hub, as kvroute reaches it: whether it answers, and offline mode on demand.

Light (no torch, no transformers): model loading and the dataset importers ask the same question.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from urllib.parse import urlparse


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (honours HF_ENDPOINT and HF_HUB_OFFLINE)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def hub_offline(offline: bool = True) -> Iterator[None]:
    """huggingface_hub in offline mode inside the block (when ``offline``), whatever the process started with.

    huggingface_hub reads ``HF_HUB_OFFLINE`` once, when it is imported, and even a ``local_files_only``
    load asks the hub for its agent registry when it is not offline; where the hub is unreachable that
    request can wait for its timeout (or hang on a network that drops packets). kvroute decides
    reachability itself (:func:`hub_reachable`) and says so here, so a load of a cached or missing hub
    model touches no network."""
    if not offline:
        yield
        return
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before
