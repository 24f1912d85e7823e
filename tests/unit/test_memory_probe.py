"""benchmarks/common.py's memory probe: ``baseline()`` hands the heap's free pages back before the peak count starts,
so memory the measured code reuses from earlier work is counted (the plain resident size hides it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from common import MEMORY_PROBE, run_child  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status (Linux)")

# earlier work leaves ~96 MB free inside the heap (every tenth 64 KB block stays alive, so free() cannot trim the
# holes), then the measured code allocates and touches 96 MB in blocks of the same size
CHILD = MEMORY_PROBE + r"""
import json, sys
chunk, n = 64 * 1024, 1700
held = [bytearray(chunk) for _ in range(n)]
keep = held[::10]
del held
base = baseline() if sys.argv[1] == "trim" else status("VmRSS")
if sys.argv[1] != "trim":
    reset_peak()
work = [bytearray(chunk) for _ in range(n * 9 // 10)]
print(json.dumps({"peak_mb": status("VmHWM") - base, "mb": len(work) * chunk / 2**20}))
"""


def test_baseline_counts_memory_reused_from_earlier_work():
    trimmed = run_child(CHILD, "trim")
    plain = run_child(CHILD, "plain")
    assert trimmed["peak_mb"] >= 0.8 * trimmed["mb"]  # the measured allocation is seen whole
    # without the trim it reuses the resident free blocks and reads far too low: what baseline() is for
    assert plain["peak_mb"] < 0.5 * plain["mb"]
