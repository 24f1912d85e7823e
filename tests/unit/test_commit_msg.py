"""The commit-msg check (.ci/commit_msg.py): subjects of at most 72 characters, a blank line before the body."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "commit_msg.py"
_spec = importlib.util.spec_from_file_location("commit_msg", SCRIPT)
assert _spec and _spec.loader
commit_msg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(commit_msg)


@pytest.mark.parametrize(("message", "needle"), [
    ("engine: capture rows beside the fast path\n\nbody with 9.34 s vs 87.55\n", None),
    ("# a comment git adds\nfix: one line only\n", None),
    ("x" * 72 + "\n", None),
    ("x" * 73 + "\n", "73 characters, more than 72"),
    ("docs: a subject.\n", "ends with a period"),
    ("docs: subject\nbody straight after\n", "second line is not blank"),
    ("\n# only comments\n", "empty"),
])
def test_commit_messages_are_checked(message, needle):
    found = commit_msg.problems(message)
    assert (not found) if needle is None else any(needle in p for p in found), found


def test_the_hook_exits_one_with_the_reason(tmp_path):
    bad = tmp_path / "MSG"
    bad.write_text("grid_speed default run on the Intel machine after the kernel tiles: 27 cells 9.34 s vs 87.55\n")
    r = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True)
    assert r.returncode == 1 and "more than 72" in r.stderr
    bad.write_text("engine: capture rows beside the fast path\n")
    assert subprocess.run([sys.executable, str(SCRIPT), str(bad)]).returncode == 0


def test_the_hook_is_registered_for_the_commit_msg_stage():
    text = (ROOT / ".pre-commit-config.yaml").read_text()
    assert "commit_msg.py" in text and "stages: [commit-msg]" in text
