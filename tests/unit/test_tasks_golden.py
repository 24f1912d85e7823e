"""Golden files pin every generator's output for fixed seeds.

Each family has exactly one file, ``tests/golden/tasks/<family>.v<VERSION>.jsonl``. When a
generator's output changes, this test fails: bump the family's ``VERSION`` (output changed on
purpose) and regenerate with

    KVROUTE_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_tasks_golden.py

which rewrites the files and deletes those of older versions. Regenerating without a bump is
refused, so a silent change of a published generator cannot pass.
"""

import os
from pathlib import Path

import pytest

from kvroute.tasks import TaskSpec, dumps_tasks, generate_tasks, get_family

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "tasks"
NAMES = ["base", "knowledge", "multi_presence", "multi_entity", "coreference", "long_context", "hops"]
UPDATE = os.environ.get("KVROUTE_UPDATE_GOLDEN") == "1"


def golden_text(family: str) -> str:
    """Two instances per level (seed 0), plus one padded to 300 estimated tokens at depth 0.5."""
    fam = get_family(family)
    out = []
    for level in fam.levels:
        out += generate_tasks(TaskSpec(family, n=2, seed=0, difficulty=level))
    out += generate_tasks(TaskSpec(family, n=1, seed=1, target_tokens=300, depth=0.5))
    return dumps_tasks(out)


@pytest.mark.parametrize("family", NAMES)
def test_golden(family):
    version = get_family(family).VERSION
    path = GOLDEN / f"{family}.v{version}.jsonl"
    text = golden_text(family)
    others = [p for p in GOLDEN.glob(f"{family}.v*.jsonl") if p != path]
    if UPDATE:
        if path.exists() and path.read_text(encoding="utf-8") != text:
            pytest.fail(f"{family} output changed but VERSION is still {version}: bump VERSION in "
                        f"kvroute/tasks/families/{family}.py, then regenerate")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="\n")
        for p in others:
            p.unlink()
        return
    assert path.exists(), (f"no golden file for {family} v{version}; if you bumped VERSION, regenerate with "
                           "KVROUTE_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_tasks_golden.py")
    assert not others, f"stale golden files {others}; regenerate to remove them"
    assert path.read_text(encoding="utf-8") == text, (
        f"{family} generator output changed without a VERSION bump (still {version}); bump VERSION and "
        "regenerate with KVROUTE_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_tasks_golden.py")
