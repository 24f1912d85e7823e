"""Open the report in headless Chromium: it renders, shows every figure, and logs no script errors.

Chromium is not part of kvroute's install (`apt-get install chromium`; `.ci/run` installs it). Without it
the tests skip on a developer's machine and fail under CI (``CI=true``): a skip there would prove nothing.
"""

import os
import shutil
import subprocess

import numpy as np
import pytest

from kvroute.analysis.summary import AnalysisConfig
from kvroute.analysis.synthetic import SyntheticSpec, synthetic_keep_mask, synthetic_records
from kvroute.report.build import FIGURES, build_report
from kvroute.report.heatmap import SurvivalExample

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
_MISSING = "headless Chromium is not installed (apt-get install chromium)"


@pytest.fixture(autouse=True)
def _chromium_present():
    if CHROMIUM is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{_MISSING}; under CI this test must run, not skip")
        pytest.skip(_MISSING)

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("chromium_report")
    df = synthetic_records(SyntheticSpec(n_instances=15, families=("base",), long_context_lengths=(256, 512, 1024),
                                         presses=("expected_attention+per_head", "expected_attention+routes"),
                                         press_offsets=(0.0, 0.03)))
    df.loc[df.ratio == 0.9, "answer"] = "<script>console.error('injected')</script>"
    return build_report(df, out, survival=SurvivalExample(**synthetic_keep_mask()), config=AnalysisConfig(n_boot=50))


def _chromium(tmp_path, *args):
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120)


def test_chromium_renders_every_figure_without_script_errors(report, tmp_path):
    url = report.resolve().as_uri()
    dom = _chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for fig_id, _ in FIGURES:
        assert f'<figure id="{fig_id}">' in dom.stdout, fig_id
    assert dom.stdout.count('src="data:image/png;base64,') == len(FIGURES)
    assert "<script" not in dom.stdout  # the injected answer stayed text
    assert "&lt;script&gt;console.error" in dom.stdout

    shot = tmp_path / "report.png"
    run = _chromium(tmp_path, "--enable-logging=stderr", "--v=0", f"--screenshot={shot}", "--window-size=1200,3000", url)
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    log = run.stderr
    assert "Uncaught" not in log and "injected" not in log and "Refused to" not in log
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)  # [3000, 1200, 4] floats
    assert img.shape[:2] == (3000, 1200)
    assert len(np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 500  # figures, not a blank page
