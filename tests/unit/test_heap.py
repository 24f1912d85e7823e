"""Freed memory retained for reuse (kvroute.heap): no page faults for a tensor that reuses a freed block, memory
back to the system on leaving and on release, nested blocks, and the engine's results unchanged.

The page-fault and resident-memory checks run in a fresh Python each: where a block lands depends on what the heap
already holds, and a test process that ran other tests holds freed blocks of every size."""

import json
import os
import subprocess
import sys

import pytest
import torch

from kvroute import heap

pytestmark = pytest.mark.skipif(not heap.available() and os.environ.get("CI") != "true",
                                reason="needs Linux with glibc (CI machines have it: there this fails)")

PROBE = r"""
import json, os, resource, sys
import torch
from kvroute import heap

BIG = 48 << 20  # above glibc's largest mmap threshold (32 MiB): without retention always a fresh mapping
PAGES = BIG // os.sysconf("SC_PAGE_SIZE")


def faults():
    # minor page faults taken by writing a BIG tensor, then one of 3/4 BIG (each freed at once), after a larger one
    # was written and freed: where freed blocks are reused, both fit in its resident pages
    z = torch.ones(BIG // 3)
    del z
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(BIG // 4)
    del x
    y = torch.ones(BIG * 3 // 16)
    del y
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / PAGES


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / BIG


def freed():  # resident memory (in BIGs) of a BIG tensor, written, then after it is freed
    x = torch.ones(BIG // 4)
    with_it = rss()
    del x
    return with_it, rss()


out = {}
exec(sys.argv[1])
print(json.dumps(out))
"""


def probe(code: str, **env: str) -> dict:
    """Run ``code`` after PROBE's helpers in a fresh Python; it fills ``out``."""
    proc = subprocess.run([sys.executable, "-c", PROBE, code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_freed_block_is_reused_without_page_faults():
    got = probe("""
with heap.retained("cpu", enabled=False) as on:
    out["off"] = (on, faults())
with heap.retained("cpu", enabled=True) as on:
    out["on"] = (on, heap.active(), faults())
""")
    on, off_faults = got["off"]
    assert not on and off_faults > 1.0  # the control: fresh mappings, faulted in page by page (1.75 BIG written)
    on, active, on_faults = got["on"]
    assert on and active and on_faults < 0.05


def test_leaving_returns_the_memory():
    got = probe("""
with heap.retained("cpu", enabled=True):
    out["inside"] = freed()
out["after"] = (heap.active(), rss())
""")
    (with_it, after_free), (active, after_block) = got["inside"], got["after"]
    assert after_free > with_it - 0.5  # freed, but held by the process for reuse
    assert not active and after_block < with_it - 0.5  # malloc_trim gave the block back


def test_release_hands_the_free_memory_back_and_keeps_the_block():
    got = probe("""
with heap.retained("cpu", enabled=True):
    with_it, _ = freed()
    heap.release()
    out["released"] = (heap.active(), with_it, rss())
    out["next"] = freed()  # what is freed next is held again
""")
    (active, with_it, released), (with_next, after_next) = got["released"], got["next"]
    assert active and released < with_it - 0.5
    assert after_next > with_next - 0.5


def test_nested_blocks_join_the_outermost():
    got = probe("""
with heap.retained("cpu", enabled=True):
    with heap.retained("cpu", enabled=False) as inner:  # inside a retaining block: joins it
        out["inner"] = inner
    out["after_inner"] = (heap.active(), faults())  # the inner exit did not restore glibc's settings
out["after"] = heap.active()
""")
    assert got["inner"] and got["after_inner"][0] and got["after_inner"][1] < 0.05 and not got["after"]


def test_the_environment_switch():
    got = probe("""
with heap.retained("cpu") as on:
    out["on"], out["faults"] = on, faults()
out["describe"] = heap.describe()
""", KVROUTE_RETAIN_HEAP="0")
    assert not got["on"] and got["faults"] > 1.0 and "KVROUTE_RETAIN_HEAP=0" in got["describe"]


def test_the_rule_and_other_devices():
    assert heap.heap_rule({}) and not heap.heap_rule({"KVROUTE_RETAIN_HEAP": "0"})
    with heap.retained("meta") as on:  # not the CPU: nothing to retain
        assert not on and not heap.active()
    old = heap.RETAIN
    try:
        heap.RETAIN = False
        with heap.retained("cpu") as on:
            assert not on
    finally:
        heap.RETAIN = old


def test_engine_results_are_the_same_with_and_without_retention():
    from kvroute.engine import Cell, DecodeSettings, Engine
    from kvroute.engine.reference import kvpress_prompt_ids
    from kvroute.models import tiny_model

    lm = tiny_model("qwen2", seed=0)

    class P:
        context_ids, question_ids = kvpress_prompt_ids(lm.tokenizer, "Alice was born in Ferravik. " * 24,
                                                       "Question: where was Alice born?")

    cells = [Cell("none", 0.0), Cell("snapkv", 0.5), Cell("streaming_llm", 0.7)]
    runs = []
    for on in (False, True):
        old = heap.RETAIN
        heap.RETAIN = on
        try:
            res = Engine(lm, DecodeSettings(max_new_tokens=4)).run(P, cells, lens_ids=[5, 7], lens_seqs=[[5, 6, 7]])
            res.raise_for_errors()
        finally:
            heap.RETAIN = old
        runs.append(res.outputs)
    for a, b in zip(*runs, strict=True):
        assert a.tokens == b.tokens
        for field in ("lens_logprob", "lens_rank", "lens_seq_logprob", "gold_logprob"):
            va, vb = getattr(a, field), getattr(b, field)
            assert (va is None and vb is None) or torch.equal(torch.as_tensor(va), torch.as_tensor(vb))
