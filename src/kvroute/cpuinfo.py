"""What ``/proc/cpuinfo`` says about this machine's CPU (Linux; nothing elsewhere), read once."""

from __future__ import annotations

import functools
from pathlib import Path


@functools.cache
def _fields() -> dict[str, str]:
    """Each field's value for the first processor listed ({} where the file cannot be read)."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is enough: the others repeat it
            continue
        name, sep, value = line.partition(":")
        if sep:
            fields.setdefault(name.strip(), value.strip())
    return fields


def cpu_field(name: str) -> str:
    """The value of ``name`` (e.g. ``model name``, ``vendor_id``, ``flags``) for this CPU, '' where unknown."""
    return _fields().get(name, "")
