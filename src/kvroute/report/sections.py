"""The report's sections, registered in page order; each one's prose is its template, ``templates/<name>.html``.

A :class:`ReportSection` names its element id (the registry name), its entry in the contents, its
heading and the figures it may hold; ``values`` picks from a :class:`ReportInput` what its template
arranges: tables and findings already made into HTML by code (``tables.py``, ``findings.py``),
figure slots, numbers and notes. Templates only arrange: every sentence that states a finding is
written by code. In a template, ``{% filter p %}…{% endfilter %}`` is a paragraph and ``note`` a
highlighted note (whitespace in the block collapsed, the text escaped like every text on the page),
and ``{% call slot() %}caption{% endcall %}`` draws a figure with that caption or, when its data
are missing, the note saying why. Template tags strip the whitespace before them (``{%-``, ``{{-``)
so that sections join without stray whitespace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup
from matplotlib.figure import Figure

from kvroute.analysis.common import AnalysisError
from kvroute.analysis.settings import AnalysisConfig
from kvroute.registry import Registry
from kvroute.report import figures_cliff as fc
from kvroute.report import figures_extra as fx
from kvroute.report import figures_routing as fr
from kvroute.report import html as h
from kvroute.report import tables as tb
from kvroute.report.findings import findings_html, findings_key_html, scaling_findings_html
from kvroute.report.heatmap import SurvivalExample, survival_figure
from kvroute.report.league import league_html
from kvroute.report.manifest import manifest_html
from kvroute.report.render import data_uri, png_bytes
from kvroute.report.serving import serving_html
from kvroute.report.turns import turns_html

TEMPLATES = Path(__file__).parent / "templates"
NO_MAPS = "no restoration maps of failures in this run (kvroute restore-map RUN --instance ID --cell PRESS@RATIO)"


@dataclass
class ReportInput:
    """Everything a section may show: the analysis, the run's extras, and where figures go."""

    summary: dict[str, Any]
    tables: dict[str, pd.DataFrame]
    cfg: AnalysisConfig
    df: pd.DataFrame
    files: dict[str, bytes]  # figures/<name>.png → bytes, filled as figures are drawn
    advance: Callable[[], None]  # one figure done (the progress bar)
    manifest: dict[str, Any] | None = None
    survival: SurvivalExample | None = None
    examples_per_ratio: int = 3
    tickets: pd.DataFrame | None = None
    ticket_images: list[tuple[str, bytes]] | None = None
    restoration: pd.DataFrame | None = None
    restore_maps: list[Any] | None = None  # kvroute.restore_map.RestoreMap of RUN_DIR/restore_map/

    def why(self, *sections: str) -> str:
        """The notes of the analysis sections a figure or table draws on: why it is missing."""
        notes = self.summary["notes"]
        return "; ".join(notes[x] for x in sections if x in notes) or "no data for this figure"

    def figure(self, fig_id: str, make: Callable[[], Figure | None], missing: str) -> FigureSlot:
        return FigureSlot(self, fig_id, make, missing)

    def plot(self, fig_id: str, draw: Callable[..., Figure | None], *tables: str, why: str) -> FigureSlot:
        """A figure ``draw`` makes from the analysis tables named (None where absent); where it cannot, the notes
        of analysis section ``why`` say why."""
        return FigureSlot(self, fig_id, lambda: draw(*(self.tables.get(n) for n in tables)), self.why(why))


@dataclass(frozen=True)
class FigureSlot:
    """A figure a template places with ``{% call slot() %}caption{% endcall %}``: drawn then, or a note why not."""

    r: ReportInput
    fig_id: str
    make: Callable[[], Figure | None]
    missing: str

    def __call__(self, caller: Callable[[], str]) -> Markup:
        caption = _text(caller())
        try:
            f = self.make()
        except AnalysisError as e:
            return Markup(h.note(f"{self.missing} ({e})"))
        finally:
            self.r.advance()
        if f is None:
            return Markup(h.note(self.missing))
        png = png_bytes(f)
        self.r.files[f"figures/{self.fig_id.removeprefix('fig-')}.png"] = png
        return Markup(h.figure(self.fig_id, data_uri(png), caption))


@dataclass(frozen=True)
class ReportSection:
    """One section of the page: id (its name), contents entry, heading, figures (id, title), template values."""

    name: str
    toc: str
    heading: str
    values: Callable[[ReportInput], dict[str, Any]]
    figures: tuple[tuple[str, str], ...] = ()
    opening: bool = False  # shown above the contents, where the reader lands

    def render(self, r: ReportInput) -> str:
        body = _ENV.get_template(f"{self.name}.html").render(self.values(r))
        return h.section(self.name, self.heading, body)


SECTIONS: Registry[ReportSection] = Registry("report section")


def section(name: str, toc: str, heading: str, figures: Sequence[tuple[str, str]] = (), *, opening: bool = False
            ) -> Callable[[Callable[[ReportInput], dict[str, Any]]], Callable[[ReportInput], dict[str, Any]]]:
    """Register the decorated function as the values of section ``name`` (its template is ``name``.html)."""

    def add(values: Callable[[ReportInput], dict[str, Any]]) -> Callable[[ReportInput], dict[str, Any]]:
        SECTIONS.add(ReportSection(name, toc, heading, values, tuple(figures), opening))
        return values

    return add


def _text(v: object) -> str:
    """A template block's text (whitespace collapsed, entities undone: it is escaped once, when placed), or a
    value's own text."""
    return " ".join(Markup(v).unescape().split()) if isinstance(v, Markup) else str(v)


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined)
    env.filters.update(p=lambda v: Markup(h.paragraph(_text(v))), note=lambda v: Markup(h.note(_text(v))),
                       g=lambda v: f"{v:g}", pct=lambda v: f"{v:.0%}")
    return env


_ENV = _env()
html = Markup  # HTML made by code (tables, findings), placed as it is


@section("findings", "Findings", "Findings",
         [("fig-cliff-caused", "Hallucination caused by compression"), ("fig-cliff", "Hallucination cliff")],
         opening=True)
def _findings(r: ReportInput) -> dict[str, Any]:
    s = r.summary
    return dict(findings=html(findings_html(s)), key=html(findings_key_html(s)),
                scaling=html(scaling_findings_html(s)),
                caused_figure=r.plot("fig-cliff-caused", fc.caused_cliff_figure, "cliff_curves_caused", "cliff_curves",
                                     "cliffs_caused", why="cliff_caused"),
                cliff_figure=r.plot("fig-cliff", fc.cliff_figure, "cliff_curves", "cliffs", why="cliff"))


@section("run", "What was run", "What was run")
def _run(r: ReportInput) -> dict[str, Any]:
    return dict(s=r.summary)


@section("headline", "Headline numbers", "Headline numbers")
def _headline(r: ReportInput) -> dict[str, Any]:
    rows = r.summary["headline"]
    return dict(cfg=r.cfg, table=html(tb.headline_table(rows)) if rows else "", missing=r.why("cliff"))


@section("cliff", "Hallucination cliff", "1. Hallucination cliff")
def _cliff(r: ReportInput) -> dict[str, Any]:
    return dict(table=html(tb.cliff_table(r.tables.get("cliffs"))))


@section("league", "Press league", "Press league: the routing view at matched budgets")
def _league(r: ReportInput) -> dict[str, Any]:
    return dict(league=html(league_html(r.tables.get("press_league"), r.why("press_league"), delta=r.cfg.delta,
                                        confidence=r.cfg.confidence, min_instances=r.cfg.league_min_instances)))


@section("context", "α* against context length", "2. α* against context length",
         [("fig-context", "α* against context length")])
def _context(r: ReportInput) -> dict[str, Any]:
    t = r.tables
    return dict(figure=r.plot("fig-context", fc.context_figure, "length_cliffs", "length_verdicts",
                              why="context_length"),
                table=html(tb.verdict_table(t.get("length_verdicts"))))


@section("size", "α* against model size", "2b. α* against model size", [("fig-size", "α* against model size")])
def _size(r: ReportInput) -> dict[str, Any]:
    t = r.tables
    return dict(figure=r.plot("fig-size", fc.size_figure, "size_cliffs", "size_trends", why="model_size"),
                tables=html(tb.size_tables(t.get("size_cliffs"), t.get("size_trends"))))


@section("ger", "GER and hallucination", "3. GER and hallucination", [("fig-ger", "GER and hallucination")])
def _ger(r: ReportInput) -> dict[str, Any]:
    t = r.tables
    return dict(within=html(tb.table_or_note(t.get("ger_within_ratio"), tb.WITHIN_COLS, r.why("ger_within_ratio"))),
                figure=r.plot("fig-ger", fc.ger_figure, "ger_points", "ger_correlation", why="ger_correlation"),
                conditional=html(tb.table_or_note(t.get("conditional"), tb.COND_COLS, r.why("conditional"))))


@section("rau", "Retention, accessibility, utilization", "4. Retention, accessibility, utilization",
         [("fig-rau", "Retention, accessibility, utilization")])
def _rau(r: ReportInput) -> dict[str, Any]:
    return dict(figure=r.plot("fig-rau", fr.rau_figure, "routing", why="routing"),
                breakdowns=[(by, html(table)) for by, table in tb.breakdown_tables(r.tables)])


@section("decomposition", "Failure decomposition", "5. Failure decomposition: erasure or rigidity?",
         [("fig-decomposition", "Failure decomposition")])
def _decomposition(r: ReportInput) -> dict[str, Any]:
    t = r.tables
    return dict(cfg=r.cfg, figure=r.plot("fig-decomposition", fr.decomposition_figure, "decomposition",
                                         why="decomposition"),
                table=html(tb.decomposition_table(t.get("decomposition"))),
                rigidity=html(tb.rigidity_table(t.get("rigidity"))), rigidity_missing=r.why("rigidity"))


@section("restoration", "Causal restoration", "5b. Causal restoration: what putting entries back repairs")
def _restoration(r: ReportInput) -> dict[str, Any]:
    return dict(cfg=r.cfg, table=html(tb.restoration_table(r.restoration)))


@section("restore_map", "Restoration maps", "5c. Restoration maps: which (layer, KV head) slots must keep the answer",
         [("fig-restore-map", "Restoration maps")])
def _restore_map(r: ReportInput) -> dict[str, Any]:
    from kvroute.report.restore_map import restore_map_figure, restore_map_groups, restore_map_html

    groups = restore_map_groups(r.restore_maps or [], r.df, n_boot=r.cfg.n_boot, seed=r.cfg.seed)
    parts = restore_map_html(groups)
    return dict(findings=html(parts["findings"]), table=html(parts["table"]),
                figure=r.figure("fig-restore-map", lambda: restore_map_figure(groups), NO_MAPS))


@section("consensus", "Layer-wise consensus", "6. Layer-wise head consensus",
         [("fig-consensus", "Layer-wise head consensus")])
def _consensus(r: ReportInput) -> dict[str, Any]:
    t = r.tables
    return dict(figure=r.figure("fig-consensus", lambda: fr.consensus_figure(
                    t.get("consensus_nosink_profiles"), group=t.get("consensus_group_nosink_profiles")),
                    r.why("consensus_nosink_profiles")),
                trend=html(tb.consensus_trend_table(t.get("consensus_trend"))))


@section("survival", "Evidence survival", "7. Evidence survival in one instance",
         [("fig-survival", "Evidence survival in one instance")])
def _survival(r: ReportInput) -> dict[str, Any]:
    survival = r.survival
    return dict(figure=r.figure("fig-survival", lambda: survival_figure(survival) if survival is not None else None,
                                "No keep-mask was supplied "
                                "(pass survival=SurvivalExample(keep, evidence, ...) to build_report)."))


@section("probe", "Identity and logit lens", "8. Representation: answer identity and the logit lens",
         [("fig-identity", "Answer identity probe"), ("fig-lens", "Logit lens of the gold answer"),
          ("fig-probe", "Answer-type probe (control: reads the question)")])
def _probe(r: ReportInput) -> dict[str, Any]:
    t = r.tables
    return dict(identity_figure=r.plot("fig-identity", fx.identity_figure, "identity_probe", why="identity_probe"),
                identity=html(tb.table_or_note(t.get("identity_probe"), tb.IDENTITY_COLS, r.why("identity_probe"))),
                lens_figure=r.plot("fig-lens", fx.lens_figure, "lens_profiles", why="lens_profiles"),
                probe_figure=r.plot("fig-probe", fr.probe_figure, "probe", why="probe"))


NO_ROUTE_PAIRS = "no press pair differing only in +routes selection in these records"


@section("routes", "Route-preserving selection", "Route-preserving selection: does it move the cliff?",
         [("fig-routes", "Route-preserving selection against AdaKV and per-head top-k")])
def _routes(r: ReportInput) -> dict[str, Any]:
    t = r.tables
    missing = r.why("selection_comparison") if "selection_comparison" in r.summary["notes"] else NO_ROUTE_PAIRS
    return dict(figure=r.figure("fig-routes", lambda: fx.routes_figure(t.get("selection_comparison")), missing),
                table=html(tb.table_or_note(t.get("selection_comparison"), tb.ROUTES_COLS, NO_ROUTE_PAIRS)))


@section("serving", "What the server costs", "What the server costs: paged and head-uniform constraints")
def _serving(r: ReportInput) -> dict[str, Any]:
    return {k: html(v) for k, v in serving_html(r.tables, r.why("serving_cost")).items()}


@section("turns", "Compress once, ask many", "Compress once, ask many: what later turns lose")
def _turns(r: ReportInput) -> dict[str, Any]:
    return {k: html(v) for k, v in turns_html(r.tables, r.why("turns")).items()}


@section("redundancy", "Redundancy", "10. Redundancy: reachability against the heads that keep the evidence",
         [("fig-redundancy", "Redundancy: reachability against heads keeping the evidence")])
def _redundancy(r: ReportInput) -> dict[str, Any]:
    t = r.tables
    return dict(figure=r.plot("fig-redundancy", fx.redundancy_figure, "redundancy", "redundancy_fit",
                              why="redundancy"),
                table=html(tb.table_or_note(t.get("redundancy_fit"), tb.REDUNDANCY_COLS, r.why("redundancy"))))


@section("retrieval", "Retrieval heads",
         "10b. Retrieval heads: does the answer's survival in them predict hallucination?")
def _retrieval(r: ReportInput) -> dict[str, Any]:
    return dict(table=html(tb.table_or_note(r.tables.get("retrieval"), tb.RETRIEVAL_COLS, r.why("retrieval"))))


@section("tickets", "Lottery tickets", "11. Token-route lottery tickets")
def _tickets(r: ReportInput) -> dict[str, Any]:
    listed, vs_cliffs = tb.ticket_tables(r.tickets, r.tables.get("cliffs"))
    # figure ids continue the count of the section's parts (paragraph and table, twice with the comparison)
    first = 4 if vs_cliffs else 2
    images = [html(h.figure(f"fig-ticket-{first + i}", data_uri(png), caption))
              for i, (caption, png) in enumerate((r.ticket_images or [])[:3])] if listed else []
    return dict(listed=html(listed), vs_cliffs=html(vs_cliffs), images=images)


@section("examples", "Example answers", "12. Example answers per ratio")
def _examples(r: ReportInput) -> dict[str, Any]:
    return dict(table=html(tb.examples_table(r.df, r.examples_per_ratio, r.cfg.seed)))


@section("notes", "Notes", "Notes and operational choices")
def _notes(r: ReportInput) -> dict[str, Any]:
    notes = r.summary["notes"]
    return dict(settings=html(h.table([{"setting": k, "value": v} for k, v in r.summary["settings"].items()],
                                      [("setting", "setting"), ("value", "value")])),
                notes=html(h.table([{"section": k, "note": v} for k, v in notes.items()],
                                   [("section", "section"), ("note", "note")])) if notes else "")


@section("manifest", "Run manifest", "Run manifest")
def _manifest(r: ReportInput) -> dict[str, Any]:
    return dict(manifest=html(manifest_html(r.manifest)))
