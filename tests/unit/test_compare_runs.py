"""benchmarks/compare_runs.py's field comparison (shared with heap_reuse.py): which fields of two runs' records
differ."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from compare_runs import differences, same  # noqa: E402


def test_differences_names_each_field_and_record_timings_aside():
    before = {"a": {"key": "a", "answer": "Paris", "gold_logprob": -0.25, "seconds_decode": 1.0, "lens": [1, 2]},
              "b": {"key": "b", "answer": "Rome", "gold_logprob": -1.5, "seconds_decode": 2.0, "lens": [3, 4]},
              "c": {"key": "c", "answer": "only before"}}
    after = {"a": {"key": "a", "answer": "Paris", "gold_logprob": -0.25 * (1 + 1e-12), "seconds_decode": 9.0,
                   "lens": [1, 2]},
             "b": {"key": "b", "answer": "Roma", "gold_logprob": -1.25, "seconds_decode": 2.0, "lens": [3, 5],
                   "new_field": 1}}
    # a float within 1e-9 relative is the same; a timing field never counts; a record in one run only is not compared
    # here (the callers report the sets of keys); a field missing on one side differs
    assert differences(before, after) == {"answer": ["b"], "gold_logprob": ["b"], "lens": ["b"], "new_field": ["b"]}
    assert differences(before, before) == {}


def test_same_compares_floats_to_rounding_and_the_rest_exactly():
    assert same(float("nan"), float("nan")) and same([1.0, {"x": 2.0}], [1.0 + 1e-12, {"x": 2.0}])
    assert not same(1.0, 1.0 + 1e-6) and same(1.0, 1.0 + 1e-6, rtol=1e-4)
    assert not same([1, 2], [1, 2, 3]) and not same({"x": 1}, {"y": 1}) and not same("a", "b")
