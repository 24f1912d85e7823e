"""The manifest's sessions say what their arithmetic ran on (CPU model, thread count, GPUs), and a resumed session
that runs under another one says so: its records can differ from the earlier ones in the last bits, and a keep
mask at a near-tie can select another entry."""

from __future__ import annotations

import logging

import torch

from kvroute.sweep.manifest import ARITHMETIC_KEYS, finish_session, start_session

CONFIG = {"name": "t", "settings_hash": "abc"}


def _session(run_dir, threads: int) -> dict:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        m = start_session(run_dir, config=CONFIG, backend="local", grid={}, task_files=[])
        return finish_session(run_dir, m, status="complete", cells_computed=3, seconds=1.0)
    finally:
        torch.set_num_threads(before)


def test_sessions_record_their_arithmetic_and_a_change_is_warned(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="kvroute.sweep.manifest"):
        _session(tmp_path, 1)
        _session(tmp_path, 1)
        assert not caplog.records  # the same arithmetic: nothing to say
        m = _session(tmp_path, 2)
    sessions = m["sessions"]
    assert [s["arithmetic"]["torch_threads"] for s in sessions] == [1, 1, 2]
    assert all(set(s["arithmetic"]) == set(ARITHMETIC_KEYS) for s in sessions)
    assert sessions[0]["arithmetic"]["cpu"] and m["device"]["cpu"] == sessions[0]["arithmetic"]["cpu"]
    (warning,) = caplog.records
    assert "torch_threads=2" in warning.getMessage() and "torch_threads=1" in warning.getMessage()
