"""Imported instances through the engine and the metrics on a tiny model: evidence-none rows give undefined GER."""

import json

from kvroute.engine import Cell, Engine
from kvroute.models import tiny_model
from kvroute.runner import RunSettings, run_instance
from kvroute.tasks.importers import import_tasks

FILL = "The festival takes place every spring. "


def test_located_and_evidence_none_instances_run(tmp_path):
    rows = [{"context": FILL * 6 + "Alice Morgan was born in Ferravik. " + FILL * 6,
             "question": "Where was Alice born?",
             "answer": ["ferravik"], "answer_prefix": "Answer:", "max_new_tokens": 4, "task": "qa"},
            {"context": FILL * 12, "question": "Where was Alice born?", "answer": ["Quenby"], "answer_prefix": "",
             "max_new_tokens": 4, "task": "qa"}]
    src = tmp_path / "rows.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    located, none = import_tasks(str(src)).instances
    assert located.meta["evidence"] == "located" and none.meta["evidence"] == "none"

    lm = tiny_model("llama", seed=0)
    settings = RunSettings(max_new_tokens=4)
    engine = Engine(lm, settings.decode_settings())
    cells = [Cell("none", 0.0), Cell("knorm", 0.5)]
    rec_located = run_instance(engine, located, cells, settings=settings)
    rec_none = run_instance(engine, none, cells, settings=settings)
    for r in rec_located:
        assert r["ger"] is not None and r["reachable"] is not None
    assert rec_located[0]["ger"] == 0.0  # nothing evicted at ratio 0
    for r in rec_none:
        assert r["ger"] is None and r["reachable"] is None and r["ger_evidence"] is None
        assert r["family"] == "qa" and r["f1"] is not None  # utilization is still scored
