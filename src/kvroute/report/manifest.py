"""The run manifest at the end of the report: a readable definition list, the raw JSON behind ``<details>``.

The manifest (``manifest.json``, written by the sweep) records what produced the records: package
versions, the git commit, the device, the grid and every session with its timing. The list shows
those in words; any field it does not know is shown as compact text, so nothing is hidden, and the
whole file is one click away as JSON. Every value is escaped.
"""

from __future__ import annotations

import json
from typing import Any

from kvroute.report import html as h

#: fields the list renders in its own way (everything else is shown as compact text, in file order)
_KNOWN = ("kvroute_manifest", "name", "status", "backend", "started", "finished", "versions", "git", "device",
          "grid", "sessions", "task_files", "config")


def _minutes(seconds: Any) -> str:
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return "–"
    return f"{s:.1f} s" if s < 120 else f"{s / 60:.1f} min"


def _compact(v: Any, limit: int = 300) -> str:
    text = v if isinstance(v, str) else json.dumps(v, default=str, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _git(git: Any) -> str:
    if isinstance(git, dict):
        commit = git.get("commit") or "unknown"
        return f"{commit}" + (" (with uncommitted changes)" if git.get("dirty") else "")
    return _compact(git)


def _device(d: Any) -> str:
    if not isinstance(d, dict):
        return _compact(d)
    gpus = d.get("gpus") or []
    parts = [str(d.get("platform") or d.get("machine") or "unknown platform")]
    if d.get("cpu_count") is not None:
        parts.append(f"{d['cpu_count']} CPUs, {d.get('torch_threads', '?')} torch threads")
    parts.append(f"GPUs: {', '.join(map(str, gpus))}" if gpus else "no GPU" if not d.get("cuda") else "CUDA")
    return "; ".join(parts)


def _grid(g: Any) -> str:
    if not isinstance(g, dict):
        return _compact(g)
    parts = []
    if "cells" in g:
        parts.append(f"{g['cells']} cells" + (f" = {g['units']} prefills × {g['cells_per_unit']} cells"
                                               if "units" in g and "cells_per_unit" in g else ""))
    for key in ("models", "presses", "ratios", "regimes", "seeds"):
        if g.get(key):
            parts.append(f"{key}: {', '.join(f'{x:g}' if isinstance(x, float) else str(x) for x in g[key])}")
    if isinstance(g.get("instances"), dict):
        parts.append("instances: " + ", ".join(f"{k} {v}" for k, v in g["instances"].items()))
    return "; ".join(parts) or _compact(g)


def _sessions(sessions: Any) -> str:
    """One line per session: when, how it ended, cells computed and how long it took."""
    if not isinstance(sessions, list):
        return h.esc(_compact(sessions))
    lines = []
    total = 0.0
    for s in sessions:
        if not isinstance(s, dict):
            lines.append(h.esc(_compact(s)))
            continue
        total += float(s.get("seconds") or 0)
        status = f"{s.get('status', '?')}" + (f" (stale: {s['note']})" if s.get("stale") and s.get("note") else "")
        text = (f"{s.get('started', '?')} → {s.get('finished') or 'not finished'}: {status}, "
                f"{s.get('cells_computed', '?')} cells computed"
                + (f" ({s['cells_errored']} errored)" if s.get("cells_errored") else "")
                + f" in {_minutes(s.get('seconds'))}, backend {s.get('backend', '?')}"
                + (f", `kvroute {' '.join(map(str, s['argv']))}`" if s.get("argv") else "")
                + (f"; error: {s['error']}" if s.get("error") else ""))
        lines.append(h.esc(text))
    head = f"{len(sessions)} session{'s' if len(sessions) != 1 else ''}, {_minutes(total)} of sweeping in all"
    return h.esc(head) + "<ol>" + "".join(f"<li>{x}</li>" for x in lines) + "</ol>"


def manifest_html(manifest: dict[str, Any] | None) -> str:
    """The manifest as ``<dl>`` (versions, git commit, device, grid, timings) plus its raw JSON in ``<details>``."""
    if not manifest:
        return h.note("No run manifest was given (manifest.json next to the records).")
    rows: list[tuple[str, str]] = []  # (term, already-escaped HTML)

    def add(term: str, text: str) -> None:
        rows.append((term, h.esc(text)))

    if manifest.get("name") is not None:
        add("run", f"{manifest['name']}" + (f", status {manifest['status']}" if manifest.get("status") else "")
            + (f", backend {manifest['backend']}" if manifest.get("backend") else ""))
    elif manifest.get("status") is not None:
        add("status", str(manifest["status"]))
    if manifest.get("started") or manifest.get("finished"):
        add("started → finished", f"{manifest.get('started') or '?'} → {manifest.get('finished') or 'not finished'}")
    if "versions" in manifest:
        v = manifest["versions"]
        add("versions", ", ".join(f"{k} {x}" for k, x in v.items()) if isinstance(v, dict) else _compact(v))
    if "git" in manifest:
        add("git commit", _git(manifest["git"]))
    if "device" in manifest:
        add("device", _device(manifest["device"]))
    if "grid" in manifest:
        add("grid", _grid(manifest["grid"]))
    if "sessions" in manifest:
        rows.append(("timings", _sessions(manifest["sessions"])))
    if isinstance(manifest.get("task_files"), list):
        add("task files", f"{len(manifest['task_files'])}: " + ", ".join(map(str, manifest["task_files"])))
    if isinstance(manifest.get("config"), dict) and manifest["config"].get("settings_hash"):
        add("settings hash", str(manifest["config"]["settings_hash"]))
    for k, v in manifest.items():
        if k not in _KNOWN:
            add(str(k), _compact(v))
    dl = "".join(f"<dt>{h.esc(term)}</dt><dd>{html}</dd>" for term, html in rows)
    raw = h.esc(json.dumps(manifest, indent=2, default=str, ensure_ascii=False))
    return (f'<dl class="manifest">{dl}</dl>'
            f"<details><summary>The whole manifest.json (resolved config included)</summary><pre>{raw}</pre></details>")
