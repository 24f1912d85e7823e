"""The report's opening sentences and its manifest list, on hand-built summary rows and manifests."""

from kvroute.report.findings import cliff_sentence, findings, findings_html, findings_key_html
from kvroute.report.manifest import manifest_html

ROW = {"model": "m", "press": "snapkv", "regime": "agnostic", "alpha_star": 0.7123, "alpha_star_ci": [0.65, 0.78],
       "alpha_star_identified": "identified", "alpha_star_interval": "[0.650, 0.780]", "alpha_half": 0.7,
       "alpha_half_ci": [0.5, 0.85], "safe_ratio": 0.25, "ger_within_verdict": "raises H",
       "ger_or_per_tenth": 2.254, "ger_or_per_tenth_ci": [1.45, 11.35]}


def test_a_cliff_in_words_carries_each_interval():
    assert cliff_sentence(ROW) == ("α* = 0.712 [0.650, 0.780]; halfway crossing 0.700 [0.50, 0.85]; "
                                   "certified safe ratio 0.25; eviction within instance: raises H, "
                                   "OR 2.25 [1.45, 11.35]")
    # with the caused view in the summary, it leads, and every instance's α* follows, labelled
    caused = {**ROW, "caused_n_instances": 19, "caused_alpha_star": 0.58, "caused_alpha_star_ci": None,
              "caused_alpha_star_identified": "cannot decide", "caused_alpha_star_interval": "cannot decide: too wide",
              "caused_alpha_half": 0.6, "caused_alpha_half_ci": [0.25, 0.8], "h_baseline": 0.69}
    assert cliff_sentence(caused).startswith(
        "caused by compression (19 instances right uncompressed): α* = 0.580, interval cannot decide, halfway "
        "crossing 0.600 [0.25, 0.80]; all instances (H(0) = 0.69): α* = 0.712 [0.650, 0.780]; certified")
    # separated replicates leave an end of the odds ratio's interval open (0 or ∞), never a ridge-made number
    open_end = cliff_sentence({**ROW, "ger_or_per_tenth_ci": [1.45, float("inf")]})
    assert open_end.endswith("OR 2.25 [1.45, open]")


def test_an_open_interval_says_which_end_is_not_identified():
    row = {**ROW, "alpha_star_ci": None, "alpha_star_identified": "open_below",
           "alpha_star_interval": "(open, 0.823]: the lower end is not identified — 18% of replicates below the grid",
           "alpha_half_ci": None, "alpha_half_identified": "open_above",
           "alpha_half_interval": "[0.500, open): the upper end is not identified — 30% beyond"}
    text = cliff_sentence(row)
    assert "α* = 0.712, interval (open, 0.823] (lower end not identified)" in text
    assert "halfway crossing 0.700, interval [0.500, open) (upper end not identified)" in text
    assert "18%" not in text  # the long explanation stays in the cliff table


def test_no_cliff_no_safe_ratio_and_no_ger_link():
    row = {"model": "m", "press": "p", "alpha_star": None, "cliff_status": "flat", "safe_ratio": None}
    assert cliff_sentence(row) == "no cliff located (flat); no safe ratio"


def test_findings_label_regimes_only_when_there_are_several_and_escape_names():
    rows = [ROW, {**ROW, "regime": "aware", "press": "<b>p</b>"}]
    labels = [label for label, _ in findings({"headline": rows})]
    assert labels == ["m · snapkv (agnostic)", "m · <b>p</b> (aware)"]
    page = findings_html({"headline": rows, "settings": {"delta": 0.1, "confidence": 0.9}})
    assert "&lt;b&gt;p&lt;/b&gt;" in page and "<b>p</b>" not in page
    assert "δ = 0.1" in findings_key_html({"headline": rows, "settings": {"delta": 0.1, "confidence": 0.9}})
    assert 'class="note"' in findings_html({"headline": [], "notes": {"cliff": "no compressed cells"}})


def test_manifest_list_reads_versions_commit_device_and_timings():
    m = {"name": "demo", "status": "complete", "versions": {"torch": "2.13.0", "kvpress": "0.5.5"},
         "git": {"commit": "1308fd7", "dirty": True},
         "device": {"platform": "Linux", "cpu_count": 2, "torch_threads": 2, "cuda": False, "gpus": []},
         "sessions": [{"started": "t0", "finished": "t1", "status": "complete", "cells_computed": 10, "seconds": 300,
                       "backend": "local", "argv": ["demo"]}, {"started": "t2", "seconds": 30.5}],
         "extra": "<i>x</i>"}
    page = manifest_html(m)
    assert "<dt>versions</dt><dd>torch 2.13.0, kvpress 0.5.5</dd>" in page
    assert "<dt>git commit</dt><dd>1308fd7 (with uncommitted changes)</dd>" in page
    assert "2 CPUs, 2 torch threads; no GPU" in page
    assert "2 sessions, 5.5 min of sweeping in all" in page
    assert "t0 → t1: complete, 10 cells computed in 5.0 min" in page and "t2 → not finished" in page
    assert "<dt>extra</dt><dd>&lt;i&gt;x&lt;/i&gt;</dd>" in page
    assert page.index("</dl>") < page.index("<details>") and "&quot;torch&quot;: &quot;2.13.0&quot;" in page
    assert 'class="note"' in manifest_html(None)
    assert "<dd>abc</dd>" in manifest_html({"git": "abc", "sessions": "odd"})  # odd shapes: shown, no crash


def test_size_and_length_findings_state_the_verdict_and_the_projection_against_the_paper():
    from kvroute.report.findings import length_sentence, size_sentence

    trend = {"family": "base", "press": "snapkv", "n_models": 3, "verdict": "no detectable trend", "slope": 0.12,
             "slope_low": -0.3, "slope_high": 0.5, "pred_3B": 0.7, "pred_3B_low": 0.6, "pred_3B_high": 0.8,
             "pred_3B_has_paper": False, "pred_14B": 0.75, "pred_14B_low": 0.55, "pred_14B_high": 0.92,
             "pred_14B_has_paper": True}
    text = size_sentence(trend)
    assert text.startswith("no detectable trend over 3 models, slope 0.12 logit α* per tenfold parameters "
                           "[-0.30, 0.50]")
    assert "projected α* at 14B: 0.75 [0.55, 0.92], an interval that holds the paper's 0.9" in text
    undecided = size_sentence({"verdict": "cannot decide", "n_models": 1, "slope": None, "pred_3B": None})
    assert undecided == "cannot decide over 1 models"
    lv = {"model": "m", "press": "p", "verdict": "fixed budget", "n_lengths": 4, "beta": 0.1, "beta_low": -0.2,
          "beta_high": 0.4}
    assert length_sentence(lv) == ("fixed budget over 4 context lengths, elasticity of the critical budget β = 0.10 "
                                   "[-0.20, 0.40] (0: fixed budget, 1: fixed ratio)")
    from kvroute.report.findings import scaling_findings, scaling_findings_html

    summary = {"headline": [], "size_trends": [trend], "length_verdicts": [lv]}
    labels = [label for label, _ in scaling_findings(summary)]
    assert labels == ["α* against context length · m · p", "α* against model size · base · snapkv"]
    assert findings(summary) == []  # below the cliff figure, not in the opening list
    assert "How the cliff moves" in scaling_findings_html(summary) and scaling_findings_html({}) == ""


def test_the_findings_command_prints_what_the_docs_quote(tmp_path):
    import json

    from typer.testing import CliRunner

    from kvroute.cli import app
    from kvroute.report.findings import findings_lines
    from kvroute.report.league import league_markdown

    summary = {"headline": [ROW], "press_league": [{"rank": 1, "press": "snapkv", "rank_text": "beats a|b",
                                                    "area": 0.25, "safe_ratio_text": "0.25"}]}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    out = CliRunner().invoke(app, ["findings", str(path)])
    assert out.exit_code == 0 and out.output.rstrip("\n").split("\n") == findings_lines(summary)
    table = CliRunner().invoke(app, ["findings", str(path), "--league"])
    assert table.output.rstrip("\n").split("\n") == league_markdown(summary["press_league"])
    assert "beats a\\|b" in table.output and "| – |" in table.output  # escaped pipes; missing cells in words
    kept = tmp_path / "kept.json"
    big = {**summary, "cliff_curves": [{"ratio": r} for r in range(1000)]}  # tables the findings do not read
    path.write_text(json.dumps(big))
    CliRunner().invoke(app, ["findings", str(path), "--keep", str(kept)])
    small = json.loads(kept.read_text())
    assert "cliff_curves" not in small and findings_lines(small) == findings_lines(big)
    bad = CliRunner().invoke(app, ["findings", str(tmp_path / "missing.json")])
    assert bad.exit_code != 0 and "summary.json" in bad.output + str(bad.exception)  # the CLI main prints it
