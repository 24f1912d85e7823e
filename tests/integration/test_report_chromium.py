"""Open the report in headless Chromium and check what a reader sees.

Every figure loads (natural size > 0), the page logs nothing to the console and requests nothing
from the network, its Content-Security-Policy holds (a planted script and remote image are refused,
and run when the policy is removed), a ``<script>`` in a model's answer stays text, the first screen
of a demo-like report (1300×900) shows the findings and the cliff figure, and nothing is wider than
the window (wide tables scroll inside their own box).

Geometry is read by a small script injected into a copy of the page with its CSP removed (the
original forbids scripts); the screenshot of the original page is then checked at those positions.

Chromium is not part of kvroute's install (`apt-get install chromium`; `.ci/run` installs it). Without it
the tests skip on a developer's machine and fail under CI (``CI=true``): a skip there would prove nothing.
"""

import functools
import html
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

from kvroute.analysis.summary import AnalysisConfig
from kvroute.analysis.synthetic import SyntheticModel, SyntheticSpec, synthetic_keep_mask, synthetic_records
from kvroute.report.build import FIGURES as ALL_FIGURES
from kvroute.report.build import build_report
from kvroute.report.heatmap import SurvivalExample
from kvroute.report.html import CSP

#: figures drawn only from data these records do not have: restoration maps live in RUN_DIR/restore_map/
FIGURES = tuple(f for f in ALL_FIGURES if f[0] != "fig-restore-map")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
_MISSING = "headless Chromium is not installed (apt-get install chromium)"
WIDTH, HEIGHT = 1300, 900  # the first screen of a laptop-sized window
PLANTED = "<script>console.error('injected')</script>"


@pytest.fixture(autouse=True)
def _chromium_present():
    if CHROMIUM is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{_MISSING}; under CI this test must run, not skip")
        pytest.skip(_MISSING)


FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
         "--hide-scrollbars", "--force-device-scale-factor=1"]

#: Chromium's own background services, which it calls whatever page it shows (seen with every flag above set);
#: any other host in the proxy's log was asked for by the page
CHROMIUM_SERVICES = {"clients2.google.com", "update.googleapis.com", "accounts.google.com",
                     "clientservices.googleapis.com", "redirector.gvt1.com", "safebrowsingohttpgateway.googleapis.com",
                     "optimizationguide-pa.googleapis.com"}

# Reads the page's geometry after load and writes it, as JSON, into an attribute that --dump-dom shows.
PROBE = """
window.addEventListener('load', function () {
  const W = window.innerWidth;
  function inScrollBox(el) {
    for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
      const o = getComputedStyle(p).overflowX;
      if (o === 'auto' || o === 'scroll' || o === 'hidden') return true;
    }
    return false;
  }
  const wide = [];
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && (r.right > W + 0.5 || r.left < -0.5) && !inScrollBox(el))
      wide.push(el.tagName + (el.id ? '#' + el.id : '') + ' ' + Math.round(r.left) + '..' + Math.round(r.right));
  }
  function box(el) {
    if (!el) return null;
    const r = el.getBoundingClientRect();
    return {top: r.top + scrollY, bottom: r.bottom + scrollY, left: r.left + scrollX, right: r.right + scrollX,
            border: el.clientLeft === undefined ? 0 : el.clientLeft};
  }
  const boxes = Array.from(document.querySelectorAll('div.scroll'));
  document.body.setAttribute('data-probe', JSON.stringify({
    width: W, scrollWidth: document.documentElement.scrollWidth, wide: wide.slice(0, 20),
    images: Array.from(document.images).map(i => ({figure: i.closest('figure') ? i.closest('figure').id : null,
                                                   complete: i.complete, w: i.naturalWidth, h: i.naturalHeight})),
    scripts: document.scripts.length, text: document.body.innerText,
    scrolling_tables: boxes.filter(b => b.scrollWidth > b.clientWidth + 1).length, tables: boxes.length,
    findings: box(document.getElementById('findings')), findings_list: box(document.querySelector('ul.findings')),
    cliff: box(document.querySelector('#findings figure img')),
    cliff_id: (document.querySelector('#findings figure') || {}).id,
    first_section: (document.querySelector('section') || {}).id,
    last_section: Array.from(document.querySelectorAll('section')).pop().id,
  }));
});
"""


def _records(**spec):
    df = synthetic_records(SyntheticSpec(**spec))
    df.loc[df.ratio == 0.9, "answer"] = PLANTED  # a model answer that tries to run code
    return df


DEMO_PRESSES = ("expected_attention+adakv", "expected_attention+chunk[chunk_length=128]", "expected_attention",
                "expected_attention+routes", "snapkv[window_size=16]", "streaming_llm")

DEMO_MANIFEST = {
    "kvroute_manifest": 1, "name": "demo", "status": "complete", "started": "2026-12-03T06:20:03+00:00",
    "finished": "2026-12-03T07:15:47+00:00", "backend": "local",
    "grid": {"cells": 3136, "units": 64, "cells_per_unit": 49, "models": ["smollm2-135m"],
             "presses": list(DEMO_PRESSES),
             "ratios": [0.0, 0.25, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98], "regimes": ["agnostic"], "seeds": [0]},
    "task_files": [f"tasks/family-{i}-{'0123abcd' * 4}.jsonl" for i in range(10)],
    "versions": {"python": "3.11.7", "kvroute": "0.1.0", "torch": "2.13.0+cpu", "transformers": "5.2.0",
                 "kvpress": "0.5.5"},
    "git": {"commit": "1308fd7dbf15606ab80f370da4c640eecb2b9ac6", "dirty": True},
    "device": {"platform": "Linux-6.18-x86_64-with-glibc2.36", "machine": "x86_64", "cpu_count": 2, "torch_threads": 2,
               "cuda": False, "gpus": []},
    "config": {"name": "demo", "settings_hash": "1cecebb617766b74", "presses": list(DEMO_PRESSES),
               "tasks": [{"family": "long_context", "n": 6, "target_tokens": 1600, "note": "x" * 300}]},
    "sessions": [{"started": "2026-12-03T06:20:03+00:00", "finished": "2026-12-03T06:34:42+00:00", "backend": "local",
                  "status": "complete", "cells_computed": 3136, "argv": ["demo"], "cells_errored": 0,
                  "seconds": 878.8}],
}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Two models, two presses, every figure."""
    out = tmp_path_factory.mktemp("chromium_report")
    df = _records(n_instances=15, families=("base",), long_context_lengths=(256, 512, 1024),
                  presses=("expected_attention+per_head", "expected_attention+routes"), press_offsets=(0.0, 0.03))
    return build_report(df, out, survival=SurvivalExample(**synthetic_keep_mask()), config=AnalysisConfig(n_boot=50),
                        manifest=DEMO_MANIFEST)


@pytest.fixture(scope="module")
def demo_like(tmp_path_factory):
    """What `make demo` writes: one model, the demo's six presses, its manifest."""
    out = tmp_path_factory.mktemp("chromium_demo")
    df = _records(models=(SyntheticModel("smollm2-135m", 30, 9, "llama", 0.0, 0.75, group_size=3),),
                  presses=DEMO_PRESSES, press_offsets=(0.0, 0.02, -0.03, 0.01, -0.05, 0.04), n_instances=8,
                  families=("base", "knowledge", "coreference"), long_context_lengths=(160, 320, 640))
    return build_report(df, out, title="kvroute demo study", config=AnalysisConfig(n_boot=30), manifest=DEMO_MANIFEST)


def _chromium(tmp_path, *args, timeout=120):
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=timeout)


def _without_csp(page: str) -> str:
    out = page.replace(f'<meta http-equiv="Content-Security-Policy" content="{CSP}">', "")
    assert out != page, "the page carries no CSP meta tag"
    return out


def _probe(report, tmp_path):
    """The page's geometry and state after load, at WIDTH×HEIGHT, from a copy with the probe script added."""
    copy = tmp_path / "probe.html"
    copy.write_text(_without_csp(report.read_text(encoding="utf-8"))
                    .replace("</body>", f"<script>{PROBE}</script></body>"),
                    encoding="utf-8")
    run = _chromium(tmp_path, f"--window-size={WIDTH},{HEIGHT}", "--dump-dom", copy.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    m = re.search(r'data-probe="([^"]*)"', run.stdout)
    assert m, "the probe did not run"
    return json.loads(html.unescape(m.group(1)))


class _Proxy:
    """A listener posing as Chromium's HTTP proxy: every request Chromium makes arrives here, first line logged."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    self.requests.append(conn.recv(4096).split(b"\r\n")[0].decode("latin-1"))
                except OSError as e:
                    self.requests.append(f"unreadable request: {e}")

    def flags(self):
        return [f"--proxy-server=http://127.0.0.1:{self.port}", "--proxy-bypass-list=<-loopback>"]

    @staticmethod
    def host(line):
        target = line.split(" ")[1] if " " in line else line
        return re.sub(r"^[a-z]+://", "", target).split("/")[0].split(":")[0]

    def from_page(self):
        """Requests to anything but Chromium's own services (listed, and those it calls for a blank page)."""
        return [r for r in self.requests if self.host(r) not in CHROMIUM_SERVICES | _blank_page_hosts()]

    def close(self):
        self.sock.close()


@functools.cache
def _blank_page_hosts() -> frozenset[str]:
    """The hosts this Chromium calls while showing an empty page: its own services, whatever its version adds
    (Chromium 150 from Debian also connects to www.google.com, which 156 did not), measured, not listed."""
    p = _Proxy()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run = _chromium(Path(tmp), *p.flags(), "--dump-dom", "data:text/html,<p>blank</p>")
            assert run.returncode == 0, run.stderr[-2000:]
        return frozenset(p.host(r) for r in p.requests)
    finally:
        p.close()


@pytest.fixture
def proxy():
    p = _Proxy()
    yield p
    p.close()


def test_every_figure_loads_and_nothing_is_logged(report, tmp_path):
    state = _probe(report, tmp_path)
    figures = [i for i in state["images"] if i["figure"] in dict(FIGURES)]
    assert sorted(i["figure"] for i in figures) == sorted(dict(FIGURES))
    for img in state["images"]:
        assert img["complete"] and img["w"] > 0 and img["h"] > 0, img  # decoded, not a broken-image icon

    shot = tmp_path / "report.png"
    run = _chromium(tmp_path, "--enable-logging=stderr", "--v=0", f"--screenshot={shot}", "--window-size=1200,3000",
                    report.resolve().as_uri())
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    # every console message (errors, CSP violations) is logged as INFO:CONSOLE; the page must log none
    assert [line for line in run.stderr.splitlines() if ":CONSOLE" in line] == []
    img = mpimg.imread(shot)  # [3000, 1200, 4] floats
    assert img.shape[:2] == (3000, 1200)
    # figures, not a blank page
    assert len(np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 500


def test_a_script_in_a_model_answer_stays_text(report, tmp_path):
    dom = _chromium(tmp_path, "--dump-dom", report.resolve().as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<script" not in dom.stdout  # the planted answer is no element
    assert "&lt;script&gt;console.error(" in dom.stdout
    state = _probe(report, tmp_path)
    assert state["scripts"] == 1  # only the probe's own
    assert PLANTED in state["text"]  # shown to the reader, verbatim


def test_the_report_requests_nothing_from_the_network(report, tmp_path, proxy):
    run = _chromium(tmp_path, *proxy.flags(), "--dump-dom", report.resolve().as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    assert proxy.from_page() == []
    # the listener does see what a page asks for: the same report with a remote image in it
    leaky = tmp_path / "leaky.html"
    leaky.write_text(_without_csp(report.read_text(encoding="utf-8")).replace(
        "</body>", '<img src="http://kvroute-leak.test/pixel.png"></body>'), encoding="utf-8")
    run = _chromium(tmp_path, *proxy.flags(), "--dump-dom", leaky.as_uri())
    assert any("kvroute-leak.test/pixel.png" in r for r in proxy.from_page()), proxy.requests


def test_the_csp_refuses_a_planted_script_and_remote_image(report, tmp_path, proxy):
    """As if escaping had failed: markup planted into the page itself. The CSP is what stops it."""
    plant = ('<img src="http://kvroute-leak.test/csp.png">'
             "<script>document.title = 'script ran'; console.log('script ran');</script></body>")
    page = report.read_text(encoding="utf-8")
    planted, control = tmp_path / "planted.html", tmp_path / "control.html"
    planted.write_text(page.replace("</body>", plant), encoding="utf-8")
    control.write_text(_without_csp(page).replace("</body>", plant), encoding="utf-8")

    run = _chromium(tmp_path, *proxy.flags(), "--enable-logging=stderr", "--v=0", "--dump-dom", planted.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    assert "<title>script ran</title>" not in run.stdout and "script ran" not in "".join(
        line for line in run.stderr.splitlines() if ":CONSOLE" in line and "violates" not in line)
    assert proxy.from_page() == []
    refused = [line for line in run.stderr.splitlines() if "Content Security Policy" in line]
    assert any("script" in line for line in refused) and any("csp.png" in line for line in refused), refused

    run = _chromium(tmp_path, *proxy.flags(), "--dump-dom", control.as_uri())  # without the policy, both get through
    assert "<title>script ran</title>" in run.stdout
    assert any("kvroute-leak.test/csp.png" in r for r in proxy.from_page()), proxy.requests


def test_first_screen_shows_the_findings_and_the_cliff_figure(demo_like, tmp_path):
    state = _probe(demo_like, tmp_path)
    assert state["first_section"] == "findings" and state["last_section"] == "manifest"
    f, c = state["findings_list"], state["cliff"]
    assert f["top"] < 200, f  # the findings open the page, right under the title
    assert 0 < c["top"] and c["bottom"] <= HEIGHT, (c, "the cliff figure is not wholly on the first screen")

    shot = tmp_path / "first.png"
    run = _chromium(tmp_path, f"--window-size={WIDTH},{HEIGHT}", f"--screenshot={shot}", demo_like.resolve().as_uri())
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    screen = mpimg.imread(shot)[..., :3]  # [HEIGHT, WIDTH, 3] in [0, 1]
    assert screen.shape[:2] == (HEIGHT, WIDTH)
    # the cliff figure's own pixels are on the screen where the probe found its image
    assert state["cliff_id"] == "fig-cliff-caused"  # the opening figure: the hallucination compression causes
    png = mpimg.imread(demo_like.parent / "figures" / "cliff-caused.png")[..., :3]
    top, left = round(c["top"] + c["border"]), round(c["left"] + c["border"])
    h, w = png.shape[:2]
    assert c["right"] - c["left"] - 2 * c["border"] == pytest.approx(w, abs=1)  # shown at its natural size
    here = np.abs(screen[top:top + h, left:left + w] - png).mean()
    elsewhere = np.abs(screen[top - 120:top - 120 + h, left:left + w] - png).mean()
    assert here < 0.02 and elsewhere > 5 * here, (here, elsewhere)
    # and the findings are text on the screen above it: dark pixels in most rows of the list
    rows = screen[round(f["top"]):round(min(f["bottom"], c["top"])), round(f["left"]):round(f["right"])]
    assert (rows.min(axis=(1, 2)) < 0.3).mean() > 0.5


@pytest.mark.parametrize("fixture", ["report", "demo_like"])
def test_nothing_is_wider_than_the_window(fixture, request, tmp_path):
    state = _probe(request.getfixturevalue(fixture), tmp_path)
    assert state["width"] == WIDTH
    assert state["scrollWidth"] <= WIDTH, "the page scrolls sideways"
    assert state["wide"] == [], state["wide"]  # every element outside a scroll box fits the window
    assert state["scrolling_tables"] >= 1  # wide tables exist here, and scroll in their own box
