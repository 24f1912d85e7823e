"""The import graph of ``src/kvroute``: no cycles among modules.

Read from the source with ``ast`` (nothing is imported): every ``import`` / ``from … import`` of a
kvroute module, at module level or inside a function, is an edge. ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module (the usual way to import a submodule), else to ``pkg``.
A package's ``__init__`` importing its own submodules is not a cycle by itself; a submodule that
imports its package back, or two modules that import each other directly or around a ring, are.

``KNOWN_CYCLES`` would list a ring that has to stay, with why, so that the test fails on any new
ring and on any listed ring that has been broken (remove it from the list then); it is empty.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

#: rings still in the package, each with why it is there (none at present: the family and scorer registries,
#: whose lookups imported the modules that register into them, now take their entries from their packages)
KNOWN_CYCLES: dict[frozenset[str], str] = {}


def modules() -> dict[str, Path]:
    out = {}
    for p in (SRC / "kvroute").rglob("*.py"):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imported(mod: str, path: Path, known: set[str]) -> set[str]:
    """The kvroute modules ``mod`` imports anywhere in its source."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                src = ".".join([*base, *([node.module] if node.module else [])])
            else:
                src = node.module or ""
            subs = {f"{src}.{a.name}" for a in node.names} & known
            out |= subs if subs and len(subs) == len(node.names) else {src} | subs
    return {m for m in out if m in known and m != mod}


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imported(m, p, known) for m, p in mods.items()}


def rings(g: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(g[nxt]))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                ring = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    ring.add(w)
                    if w == node:
                        break
                if len(ring) > 1:
                    out.append(frozenset(ring))
    return out


def test_the_walker_finds_a_planted_ring_and_nothing_in_a_chain():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert rings(g) == [frozenset({"a", "b", "c"})]
    assert rings({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_no_new_import_cycles_and_no_stale_entries():
    found = rings(graph())
    new = [sorted(r) for r in found if r not in KNOWN_CYCLES]
    assert not new, f"import cycles among kvroute modules: {new}"
    stale = [sorted(r) for r in KNOWN_CYCLES if r not in found]
    assert not stale, f"these listed cycles are gone; remove them from KNOWN_CYCLES: {stale}"


def unit(module: str) -> str:
    """The top-level part of the package a module belongs to (``kvroute.engine.decode`` → ``kvroute.engine``)."""
    return ".".join(module.split(".")[:2])


def test_the_top_level_packages_form_layers():
    """No upward imports: between kvroute's top-level modules and packages (models, tasks, presses, engine,
    metrics, sweep, analysis, report, cli, …) the imports form no ring, so each sits on the ones it imports.
    (``presses/check.py`` used the engine that uses presses; it lives in ``engine/`` now.)"""
    g: dict[str, set[str]] = {}
    for m, targets in graph().items():
        g.setdefault(unit(m), set())
        for t in targets:
            g.setdefault(unit(t), set())
            if unit(t) != unit(m):
                g[unit(m)].add(unit(t))
    assert rings(g) == [], f"packages that import each other: {[sorted(r) for r in rings(g)]}"
