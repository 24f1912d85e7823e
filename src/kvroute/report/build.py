"""``build_report``: records → ``report.html`` (self-contained) + ``summary.json`` + ``figures/*.png``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pandas as pd

from kvroute import __version__
from kvroute.analysis.sections import first_turns
from kvroute.analysis.summary import AnalysisConfig, run_analysis
from kvroute.files import write_folder
from kvroute.progress import SILENT, Progress
from kvroute.report import html as h
from kvroute.report.heatmap import SurvivalExample
from kvroute.report.sections import SECTIONS, ReportInput

log = logging.getLogger(__name__)

#: every figure the report can hold: (element id, title), in page order
FIGURES: tuple[tuple[str, str], ...] = tuple(f for _, sec in SECTIONS.items() for f in sec.figures)

#: what a report folder may hold besides the files one report writes (figures of an earlier report)
REPORT_FILES = frozenset({"report.html", "summary.json", "figures/*"})


def build_report(df: pd.DataFrame, out_dir: str | Path, *, manifest: dict[str, Any] | None = None,
                 title: str = "kvroute report", survival: SurvivalExample | None = None,
                 config: AnalysisConfig | None = None, examples_per_ratio: int = 3,
                 tickets: pd.DataFrame | None = None, ticket_images: list[tuple[str, bytes]] | None = None,
                 restoration: pd.DataFrame | None = None, restore_maps: list[Any] | None = None,
                 progress: Progress = SILENT) -> Path:
    """Analyse ``df`` and write ``report.html``, ``summary.json`` and ``figures/`` into ``out_dir``.

    ``restoration``: :func:`kvroute.analysis.restoration.restoration_table` of the run's restored cells (``df``
    holds the presses' own cells only). ``restore_maps``: the run's restoration maps
    (:func:`kvroute.analysis.restore_map.load_maps` of ``RUN_DIR/restore_map/``).

    ``survival`` is one instance's keep-mask for the survival heatmap (the records do not hold
    keep-masks). Sections whose data are missing say so instead of showing a figure. The page is the
    sections registered in :mod:`kvroute.report.sections`, in order: it opens with the findings in
    words and the cliff figure; the run manifest closes it. ``progress`` shows the analysis and the
    figures as two stages. Returns the path of ``report.html``.

    Nothing is written until every file is made; then ``out_dir`` is replaced whole
    (:func:`kvroute.files.write_folder`: a temporary folder next to it, swapped in with one rename), so
    a report that fails or is killed leaves no half-written folder and an earlier report unchanged.
    """
    cfg = config or AnalysisConfig()
    with progress.task(f"report: analysing {len(df)} records ({cfg.n_boot} bootstrap replicates)", total=None):
        analysis = run_analysis(df, cfg)
    s = analysis.summary
    files: dict[str, bytes] = {}  # relative path → bytes, written together at the end
    with progress.task("report: drawing the figures", total=len(FIGURES)) as bar:
        # the examples and maps read turn 1 of each conversation, as every estimate but the turn analysis does
        r = ReportInput(s, analysis.tables, cfg, first_turns(df), files, bar.advance, manifest=manifest,
                        survival=survival, examples_per_ratio=examples_per_ratio, tickets=tickets,
                        ticket_images=ticket_images, restoration=restoration, restore_maps=restore_maps)
        sections = [(sec, sec.render(r)) for _, sec in SECTIONS.items()]
    meta = (f"kvroute {__version__} · {s['n_records']} records · "
            f"bootstrap {cfg.n_boot} replicates over instances, seed {cfg.seed}")
    page = h.page(title, meta, [(sec.name, sec.toc) for sec, _ in sections],
                  [html for sec, html in sections if not sec.opening],
                  opening="".join(html for sec, html in sections if sec.opening))
    files["summary.json"] = json.dumps(s, indent=2, allow_nan=False, ensure_ascii=False).encode("utf-8")
    files["report.html"] = page.encode("utf-8")  # last: the entry point
    out = Path(out_dir)
    write_folder(out, files, owned=REPORT_FILES)
    path = out / "report.html"
    log.info("wrote %s", path)
    return path


def build_run_report(run: str | Path, out_dir: str | Path | None = None, *, title: str = "kvroute report",
                     config: AnalysisConfig | None = None, survival_file: str | Path | None = None,
                     progress: Progress = SILENT) -> Path:
    """The report of a run: its records, manifest, tickets and a saved keep-mask, read from disk and reported.

    The one way ``kvroute report`` and ``kvroute demo`` turn a run into a report. ``run`` is a run
    folder (store, manifest, ``tickets.jsonl``, ``tickets/*.png``, ``masks/*.npz``) or a records file
    (.parquet, .csv, .jsonl; its folder is read for the rest). ``out_dir`` defaults to ``RUN/report``.
    ``survival_file`` picks the keep-mask for the survival heatmap (default: the first under ``masks/``).
    A session that a killed sweep left "running" reads "interrupted" in the report (in memory only).
    """
    from kvroute.analysis.load import load_manifest, load_records
    from kvroute.analysis.restoration import restoration_table
    from kvroute.analysis.tickets import load_tickets
    from kvroute.report.heatmap import load_survival

    run = Path(run)
    base = run if run.is_dir() else run.parent
    df = load_records(run)
    restoration = restoration_table(load_records(run, with_restored=True))
    restore_maps = _restore_maps(base)
    if survival_file is None:
        masks = sorted((base / "masks").glob("*.npz"))
        survival_file = masks[0] if masks else None
    pngs = sorted((base / "tickets").glob("*.png"))[:3]
    images = [(f"Token-route lottery ticket for instance {p.stem}: which layers and KV heads keep its evidence "
               "tokens.", p.read_bytes()) for p in pngs]
    manifest = load_manifest(run)
    if manifest is not None:
        from kvroute.sweep.manifest import mark_stale

        mark_stale(manifest, base)
    return build_report(df, Path(out_dir) if out_dir is not None else base / "report", manifest=manifest,
                        title=title, config=config, tickets=load_tickets(run),
                        survival=load_survival(survival_file) if survival_file is not None else None,
                        ticket_images=images, restoration=restoration, restore_maps=restore_maps, progress=progress)


def _restore_maps(base: Path) -> list[Any]:
    """The run's restoration maps (``RUN_DIR/restore_map/``, kvroute restore-map), none when it has no map store."""
    from kvroute.analysis.restore_map import load_maps
    from kvroute.record_format import STORE_NAME
    from kvroute.restore_map import MAP_DIR

    return load_maps(base / MAP_DIR) if (base / MAP_DIR / STORE_NAME).is_file() else []
