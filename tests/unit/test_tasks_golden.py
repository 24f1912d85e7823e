"""Golden files pin every generator's output for fixed seeds.

Each family has ``tests/golden/tasks/<family>.v<VERSION>.jsonl`` (two readable instances per
level, plus one padded with filler) and ``<family>.v<VERSION>.sha256`` (the digest of a larger
sample: 100 instances per level over all question types, so rare branches are pinned too). When a
generator's output changes, this test fails: bump the family's ``VERSION`` (the output changed on
purpose) and regenerate with

    KVROUTE_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_tasks_golden.py

which writes the files and deletes those of older versions. Regenerating without a bump is
refused, so a silent change of a published generator cannot pass.
"""

import hashlib
import os
from pathlib import Path

import pytest

from kvroute.tasks import FAMILIES, TaskSpec, dumps_tasks, generate_tasks, get_family

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "tasks"
NAMES = FAMILIES.names()  # every registered family: a new one cannot land without its golden files
UPDATE = os.environ.get("KVROUTE_UPDATE_GOLDEN") == "1"
HINT = "regenerate with KVROUTE_UPDATE_GOLDEN=1 python -m pytest tests/unit/test_tasks_golden.py"


def golden_text(family: str) -> str:
    """Two instances per level (seed 0), plus one padded to 300 estimated tokens at depth 0.5."""
    fam = get_family(family)
    out = []
    for level in fam.levels:
        out += generate_tasks(TaskSpec(family, n=2, seed=0, difficulty=level))
    out += generate_tasks(TaskSpec(family, n=1, seed=1, target_tokens=300, depth=0.5))
    return dumps_tasks(out)


def golden_digest(family: str) -> str:
    fam = get_family(family)
    h = hashlib.sha256()
    for level in fam.levels:
        spec = TaskSpec(family, n=100, seed=0, difficulty=level, question_types=fam.question_types,
                        target_tokens=120 if family == "long_context" else None)
        h.update(dumps_tasks(generate_tasks(spec)).encode("utf-8"))
    return h.hexdigest() + "\n"


@pytest.mark.parametrize("family", NAMES)
def test_golden(family):
    version = get_family(family).VERSION
    files = {GOLDEN / f"{family}.v{version}.jsonl": golden_text(family),
             GOLDEN / f"{family}.v{version}.sha256": golden_digest(family)}
    others = [p for p in GOLDEN.glob(f"{family}.v*") if p not in files]
    if UPDATE:
        for path, text in files.items():
            if path.exists() and path.read_text(encoding="utf-8") != text:
                pytest.fail(f"{family} output changed but VERSION is still {version}: bump VERSION in "
                            f"kvroute/tasks/families/{family}.py, then regenerate")
        GOLDEN.mkdir(parents=True, exist_ok=True)
        for path, text in files.items():
            path.write_text(text, encoding="utf-8", newline="\n")
        for p in others:
            p.unlink()
        return
    for path, text in files.items():
        assert path.exists(), f"no golden file {path.name} for {family} v{version}; if you bumped VERSION, {HINT}"
        assert path.read_text(encoding="utf-8") == text, (
            f"{family} generator output changed without a VERSION bump (still {version}) — {path.name} differs; "
            f"bump VERSION and {HINT}")
    assert not others, f"stale golden files {[p.name for p in others]}; {HINT}"
