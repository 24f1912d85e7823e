"""The report: every figure embedded, every task/model text escaped, graceful degradation, the CLI."""

import base64
import json
import re
import sqlite3

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvroute.analysis.summary import AnalysisConfig
from kvroute.analysis.synthetic import SyntheticSpec, synthetic_keep_mask, synthetic_records
from kvroute.errors import StoreError
from kvroute.report.build import FIGURES as ALL_FIGURES
from kvroute.report.build import build_report
from kvroute.report.heatmap import SurvivalExample
from kvroute.report.html import esc

#: figures drawn only from data these records do not have: restoration maps live in RUN_DIR/restore_map/
MAP_ONLY = {"fig-restore-map"}
FIGURES = tuple(f for f in ALL_FIGURES if f[0] not in MAP_ONLY)

EVIL = "<script>alert('pwned')</script>"
FAST = AnalysisConfig(n_boot=100)
IMG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def hostile_records() -> pd.DataFrame:
    spec = SyntheticSpec(n_instances=20, families=("base", "coreference"), long_context_lengths=(256, 512, 1024),
                         presses=("expected_attention+per_head", "snapkv+adakv", "expected_attention+routes"),
                         press_offsets=(0.0, 0.03, 0.04))
    df = synthetic_records(spec)
    df.loc[df.ratio == 0.9, "answer"] = EVIL  # a model answer that tries to run code
    df.loc[df.model == "qwen-like", "model"] = '"><img src=x onerror=alert(1)>'  # names reach every table
    return df


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    survival = SurvivalExample(**synthetic_keep_mask(), title="base-0001 <i>α=0.8</i>")
    path = build_report(hostile_records(), out, manifest={"git": "abc123", "note": EVIL}, title="Run <b>1</b>",
                        survival=survival, config=FAST)
    return path, path.read_text(encoding="utf-8")


def test_report_has_every_figure_embedded_as_png(report):
    path, html = report
    for fig_id, _ in FIGURES:
        assert f'<figure id="{fig_id}">' in html, fig_id
    images = IMG.findall(html)
    assert len(images) == len(FIGURES)
    for b64 in images:
        assert base64.b64decode(b64)[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (path.parent / "figures").glob("*.png")) == sorted(
        f"{i.removeprefix('fig-')}.png" for i, _ in FIGURES)


def test_report_escapes_task_and_model_text(report):
    _, html = report
    assert "<script" not in html.lower()  # no script at all, not even ours
    assert "&lt;script&gt;alert(&#x27;pwned&#x27;)&lt;/script&gt;" in html  # the answer shows as text
    assert "onerror=alert(1)>" not in html and "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<title>Run &lt;b&gt;1&lt;/b&gt;</title>" in html


def test_report_is_self_contained(report):
    _, html = report
    assert "http://" not in html and "https://" not in html
    assert "<link" not in html and "@import" not in html
    assert "Content-Security-Policy" in html and "default-src 'none'" in html


def test_summary_json_is_written(report):
    path, _ = report
    s = json.loads((path.parent / "summary.json").read_text())
    assert s["headline"] and s["settings"]["n_boot"] == 100
    assert {"cliffs", "length_verdicts", "decomposition", "probe"} <= set(s)


def test_report_degrades_when_data_are_missing(tmp_path):
    df = hostile_records()
    df = df[df.family != "long_context"]
    df = df.drop(columns=[*(c for c in df.columns if c.startswith(("consensus", "rho"))), "probe_features"])
    html = build_report(df, tmp_path, config=FAST).read_text()
    missing = {"fig-context", "fig-consensus", "fig-survival", "fig-probe"}
    for fig_id, _ in FIGURES:
        assert (f'<figure id="{fig_id}">' in html) == (fig_id not in missing), fig_id
    assert "no &#x27;long_context&#x27; family cells" in html
    assert "No keep-mask was supplied" in html and "No run manifest" in html


def _run_dir(tmp_path) -> None:
    df = synthetic_records(SyntheticSpec(n_instances=12, families=("base",), long_context_lengths=()))
    for c in df.columns:
        if df[c].map(lambda v: isinstance(v, list)).any():
            df[c] = df[c].map(json.dumps)
    with sqlite3.connect(tmp_path / "store.sqlite") as con:
        df.to_sql("records", con, index=False)
    (tmp_path / "manifest.json").write_text(json.dumps({"git": "deadbeef"}))


def test_cli_report_on_a_run_directory_and_a_records_file(tmp_path):
    from kvroute.cli import app

    _run_dir(tmp_path)
    runner = CliRunner()
    res = runner.invoke(app, ["report", str(tmp_path), "--n-boot", "50"])
    assert res.exit_code == 0, res.output
    html = (tmp_path / "report" / "report.html").read_text()
    assert "deadbeef" in html and (tmp_path / "report" / "summary.json").is_file()

    csv = tmp_path / "records.csv"
    pd.read_sql_query("SELECT * FROM records", sqlite3.connect(tmp_path / "store.sqlite")).to_csv(csv, index=False)
    res = runner.invoke(app, ["report", str(csv), "--out", str(tmp_path / "r2"), "--n-boot", "50"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "r2" / "report.html").is_file()

    res = runner.invoke(app, ["report", str(tmp_path / "nowhere")])
    assert isinstance(res.exception, StoreError)


def test_context_figure_draws_a_point_outside_its_interval():
    """A point estimate may sit outside its percentile interval; the figure must still draw."""
    from kvroute.report.figures_cliff import context_figure

    by_length = pd.DataFrame({"model": "m", "press": "p", "regime": "agnostic", "T": [128, 256, 512, 1280],
                              "alpha_star": [0.5, 0.6, 0.7, 0.8], "alpha_star_low": [0.55, 0.5, 0.6, 0.7],
                              "alpha_star_high": [0.6, 0.7, 0.8, 0.9], "budget_star": [64, 100, 150, 250],
                              "budget_star_low": [50, 90, 160, 200], "budget_star_high": [70, 120, 170, 300]})
    assert context_figure(by_length, pd.DataFrame()) is not None


def _sections(html):
    return re.findall(r'<section id="([^"]+)">', html)


def test_report_opens_with_the_findings_and_the_cliff_figure_and_closes_with_the_manifest(report):
    path, html = report
    ids = _sections(html)
    assert ids[0] == "findings" and ids[-1] == "manifest"
    assert html.index('<section id="findings">') < html.index("<nav>")  # before the contents and every detail
    findings = html[html.index('<section id="findings">'):html.index("<nav>")]
    assert '<figure id="fig-cliff">' in findings and html.count('<figure id="fig-cliff">') == 1
    # every headline row is a finding in words, with its α* and the α* interval (or its open end) beside it
    s = json.loads((path.parent / "summary.json").read_text())
    items = re.findall(r"<li><strong>(.*?)</strong>: (.*?)</li>", findings)
    assert len(items) >= len(s["headline"]) > 0
    for row, (label, text) in zip(s["headline"], items, strict=False):
        assert label.endswith(esc(row["press"])), (label, row["press"])
        if row["alpha_star"] is not None:
            ci = row["alpha_star_ci"]
            expected = (f"α* = {row['alpha_star']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci and None not in ci
                        else f"α* = {row['alpha_star']:.3f}, interval ")
            assert expected in text, (expected, text)
        assert f"safe ratio {row['safe_ratio']:g}" in text


def test_manifest_is_a_definition_list_with_the_raw_json_behind_details(report):
    _, html = report
    manifest = html[html.index('<section id="manifest">'):]
    assert '<dl class="manifest">' in manifest
    assert "<dt>git commit</dt><dd>abc123</dd>" in manifest
    assert "<dt>note</dt><dd>&lt;script&gt;" in manifest  # unknown fields still shown, escaped
    details = manifest[manifest.index("<details>"):]
    assert "<summary>" in details and "&quot;git&quot;: &quot;abc123&quot;" in details


def test_every_table_scrolls_in_its_own_box(report):
    _, html = report
    assert html.count("<table>") == html.count('<div class="scroll"><table>') > 5
    assert ".scroll { overflow-x: auto" in html


def test_report_has_the_press_league_right_after_the_cliff(report):
    path, html = report
    ids = _sections(html)
    assert ids.index("league") == ids.index("cliff") + 1 and '<a href="#league">' in html
    league = html[html.index('<section id="league">'):html.index('<section id="context">')]
    assert "matched budgets" in league and "Rows are ranked" in league.split("<table>")[0]  # how to read it, first
    assert "<th>certified safe ratio</th>" in league and "<th>α* [95% CI]</th>" in league
    assert ("<th>GER at the safe ratio [95% CI]</th>" in league
            and "<th>eviction effect within instance [95% CI]</th>" in league
            and "<th>paired comparisons</th>" in league)
    s = json.loads((path.parent / "summary.json").read_text())
    rows = s["press_league"]
    assert len(rows) == 2 * 3  # two models × three presses, the baseline not ranked
    assert league.count("<tr>") == len(rows) + 1  # one header row
    for r in rows:  # every row rendered with its words, escaped
        for col in ("alpha_star_text", "safe_ratio_text", "ger_at_safe_text", "eviction_text"):
            assert esc(r[col]) in league, (col, r[col])
    for model in {r["model"] for r in rows}:
        mine = [r for r in rows if r["model"] == model]
        ranks = [r["rank"] for r in mine]  # paired ranks: 1 + presses that beat it; ties share a rank
        assert ranks[0] == 1 and ranks == sorted(ranks) and all(1 <= k <= 3 for k in ranks)
        for r in mine:
            assert r["rank"] == 1 + (r["rank_text"].split("beaten by ")[1].split(";")[0].count(",") + 1
                                     if "beaten by" in r["rank_text"] else 0)


def test_the_page_is_the_registered_sections_in_registry_order(report):
    from kvroute.report.sections import SECTIONS

    _, html = report
    names = SECTIONS.names()
    assert _sections(html) == names  # every registered section, in order, and no other
    nav = html[html.index("<nav>"):html.index("</nav>")]
    assert re.findall(r'<a href="#([^"]+)">', nav) == names  # the contents list them in the same order
    figures = re.findall(r'<figure id="(fig-[a-z-]+)">', html)
    assert [f for f in figures if not f.startswith("fig-ticket")] == [i for i, _ in FIGURES]  # page order
