"""docs/models.md's architecture table is generated from the equivalence reports, never written by hand."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import support_table  # noqa: E402


def test_the_docs_table_is_the_generated_one():
    text = support_table.DOC.read_text(encoding="utf-8")
    generated = "\n".join(support_table.table())
    assert generated in text, "docs/models.md's architecture table is stale: run python benchmarks/support_table.py"


def test_the_packaged_support_rows_are_the_generated_ones():
    assert support_table.SUPPORT.read_text(encoding="utf-8") == support_table.support_text(), (
        "kvroute/models/architectures.json is stale: run python benchmarks/support_table.py")


def test_a_report_is_read_into_its_agreement_differences_and_refusal(tmp_path):
    report = tmp_path / "equivalence_tiny-x.md"
    report.write_text("# Equivalence\n\n| press | agreement | keep masks |\n|---|---|---|\n| `knorm` | 8/8 | – |\n"
                      "| `snapkv` | 6/8 | – |\n\nDisagreements:\n\n- snapkv@0.9 on a: token 3 differs\n\n"
                      "agreement: 14/16\n", encoding="utf-8")
    rep = support_table.read_report(report)
    assert rep.agreement == "14/16" and rep.presses == {"knorm": (8, 8), "snapkv": (6, 8)}
    assert rep.differences == ["snapkv@0.9 on a: token 3 differs"] and not rep.not_run
    refused = tmp_path / "equivalence_tiny-y.md"
    refused.write_text("Model: tiny-y. Not run: kvroute cannot study tiny-y (y) yet: no.\nagreement: not studied\n",
                       encoding="utf-8")
    assert support_table.read_report(refused).not_run.startswith("kvroute cannot study tiny-y")


def test_a_head_size_variants_report_belongs_to_its_architecture():
    """``tiny-ARCH-HEADSIZE`` reports (``--model tiny-gemma3-128``) are listed under ARCH's other reports."""
    assert support_table.tiny_architecture("tiny-gemma3-128") == "gemma3"
    assert support_table.tiny_architecture("tiny-llama3-64") == "llama3"
    assert support_table.tiny_architecture("tiny-gemma3_text") == "gemma3_text"
    assert support_table.tiny_architecture("smollm2-135m") is None
