"""Presses from outside kvroute: a class by import path, or an installed plugin's entry point.

Two ways to use a press of your own without forking kvroute:

* by import path: ``--press mypkg.presses:MyPress``, with parameters and a selection as for any
  press (``mypkg.presses:MyPress[alpha=2]+adakv``); the module must be importable (installed, or
  the folder holding it on ``PYTHONPATH``);
* as a plugin: a distribution declaring ``[project.entry-points."kvroute.presses"]`` with
  ``my_press = "mypkg.presses:MyPress"`` makes ``my_press`` a press name once it is installed.

The class is a kvpress ``ScorerPress`` subclass — wrapped by the adapter of kvroute's own kvpress
scorers (:func:`~kvroute.presses.scorers.kvpress_adapter.kvpress_scorer`), so its dataclass fields
are its parameters, checked and cast like the built-ins' — or a kvroute
:class:`~kvroute.presses.scorers.base.Scorer` subclass.

Ratio dependence. kvpress sets ``compression_ratio`` before every ``score()`` call, so a press may
read it, and kvroute cannot tell whether it does. An outside ScorerPress is therefore scored once
per ratio (what kvpress does: always right, slower on a grid of ratios) unless the class says
otherwise in ``kvroute_options = {"ratio_dependent": False}``; that mapping takes
:func:`~kvroute.presses.scorers.kvpress_adapter.kvpress_scorer`'s keywords (``needs_attentions``,
``random_draws``, ``min_tokens_param``, ``schema``, ...).

Names. A class is named by the string that named it (the import path, or the plugin's name), so
records, cell keys and ``--resume`` keep exactly what the user wrote. Built-in names win: a plugin
under a built-in's name is refused. Plugins are discovered on first need (a name that is not
registered, or ``kvroute presses list``), never at ``import kvroute``; a plugin that fails to import
(whatever it raises, ``SystemExit`` included) fails when it is used, with its error, and never the other
presses.

The fence. Every class given here is code kvroute did not write, so its scorer class is
:func:`~kvroute.presses.fence.fenced`: what it raises in any call becomes a per-cell error naming it, it
scores copies of the shared prefill's tensors, and its scores are checked (shape, dtype, finite) before
they are used (see :mod:`kvroute.presses.fence`).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import pkgutil
import re
import sys
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from importlib.metadata import EntryPoint, entry_points
from types import FunctionType, ModuleType
from typing import Any

from kvroute.errors import ConfigError, did_you_mean, error_reason, suggest, with_article
from kvroute.presses.fence import FATAL, fenced
from kvroute.presses.scorers.base import SCORERS, Scorer
from kvroute.presses.scorers.kvpress_adapter import KvpressScorer, kvpress_scorer

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "kvroute.presses"
ACCEPTED = "a kvpress ScorerPress subclass or a kvroute Scorer subclass"
_IDENT = r"[A-Za-z_]\w*"
_IMPORT_PATH = re.compile(rf"^({_IDENT}(?:\.{_IDENT})*):({_IDENT}(?:\.{_IDENT})*)$")
_NAME = re.compile(rf"^{_IDENT}$")
#: an entry point's value as importlib.metadata parses it: ``module[:attr]`` (extras in brackets allowed)
_ENTRY_VALUE = re.compile(rf"^\s*{_IDENT}(?:\.{_IDENT})*\s*(?::\s*{_IDENT}(?:\.{_IDENT})*\s*)?(?:\[[^\]]*\])?\s*$")


@dataclass(frozen=True)
class Plugin:
    """One entry point of the ``kvroute.presses`` group; ``problem`` says why it is refused (else None)."""

    name: str
    value: str  # module:Class
    dist: str  # the distribution that declares it
    entry_point: EntryPoint = field(compare=False, repr=False)
    problem: str | None = None

    @property
    def label(self) -> str:
        """How messages name it: ``press plugin 'name' (module:Class, from dist)``."""
        return f"press plugin {self.name!r} ({self.value}, from {self.dist})"


def is_import_path(name: str) -> bool:
    """A press name that names a class by import path rather than a registered or plugin name."""
    return ":" in name or "." in name


@functools.cache
def plugins() -> tuple[Plugin, ...]:
    """Every declared plugin press, the refused ones with their ``problem`` (read once, nothing imported).

    Every built-in is registered before clashes are judged: importing this module's
    ``kvroute.presses.scorers.base`` ran the scorers package, which registers them all.
    """
    out: list[Plugin] = []
    taken: dict[str, str] = {}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (e.name, e.value)):
        dist = ep.dist.name if ep.dist is not None else "an unnamed distribution"
        problem = None
        if ep.name in SCORERS:
            problem = "its name is a built-in scorer's, and built-ins win; rename the entry point"
        elif not _NAME.match(ep.name):
            problem = "its name is not a press name (letters, digits and _, not starting with a digit)"
        elif not _ENTRY_VALUE.match(ep.value):  # importlib's own parse of it fails with an AttributeError
            problem = f"its value {ep.value!r} is not module:Class (e.g. mypkg.presses:MyPress)"
        elif ep.name in taken:
            problem = f"{taken[ep.name]} declares the same name first"
        else:
            taken[ep.name] = dist
        plugin = Plugin(ep.name, ep.value, dist, ep, problem)
        if problem:
            log.warning("%s", refused_line(plugin))
        out.append(plugin)
    return tuple(out)


def refused_line(plugin: Plugin) -> str:
    return f"{plugin.label} is refused: {plugin.problem}"


def plugin_names() -> list[str]:
    """The usable plugin names (for did-you-mean suggestions)."""
    return [p.name for p in plugins() if p.problem is None]


_RESOLVED: dict[str, type[Scorer]] = {}


def outside_scorer(name: str) -> type[Scorer] | None:
    """The scorer class for an import path or a plugin name; None for a name that is neither.

    Raises :class:`~kvroute.errors.ConfigError` (one line) when the path or plugin does not give a
    press class. Resolved classes are kept, so a name builds the same class every time.
    """
    if name in _RESOLVED:
        return _RESOLVED[name]
    if is_import_path(name):
        cls = scorer_class(name, import_object(name), f"press {name!r}")
    else:
        plugin = next((p for p in plugins() if p.name == name and p.problem is None), None)
        if plugin is None:
            return None
        cls = scorer_class(name, load_plugin(plugin), plugin.label)
    _RESOLVED[name] = cls
    return cls


def load_plugin(plugin: Plugin) -> Any:
    try:
        return plugin.entry_point.load()
    except FATAL:
        raise
    except (Exception, SystemExit) as e:  # the plugin's own import error, whatever it is, is the plugin's fault
        raise ConfigError(f"{plugin.label} failed to import: {error_reason(e)}") from None


def import_object(path: str) -> Any:
    """The object ``module:attr.attr`` names, or a one-line error saying which part is missing."""
    m = _IMPORT_PATH.match(path)
    if not m:
        raise ConfigError(f"press {path!r} is neither a registered name nor an import path module:Class "
                          "(e.g. mypkg.presses:MyPress)")
    mod_name, attrs = m.groups()
    obj: Any = _import_module(mod_name, path)
    for i, part in enumerate(attrs.split(".")):
        if not hasattr(obj, part):
            where = f"module {mod_name!r}" if i == 0 else f"{mod_name}:{'.'.join(attrs.split('.')[:i])}"
            public = [n for n in dir(obj) if not n.startswith("_")]
            close = suggest(part, public)
            presses = [n for n in public if _is_press_class(getattr(obj, n, None))]
            msg = f"press {path!r}: {where} has no attribute {part!r}"
            if close:
                msg += f"; {did_you_mean(close)}"
            elif presses:
                msg += f"; its press classes: {', '.join(presses)}"
            raise ConfigError(msg)
        obj = getattr(obj, part)
    return obj


def _import_module(mod_name: str, path: str) -> ModuleType:
    try:
        return importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        missing = e.name or mod_name
        if missing != mod_name and not mod_name.startswith(missing + "."):  # the module's own import failed
            raise ConfigError(f"press {path!r}: importing module {mod_name!r} failed: {error_reason(e)}") from None
        parent, _, leaf = missing.rpartition(".")
        # the closest module beside it: in its package's folders, or on sys.path for a top-level name
        folders = getattr(sys.modules.get(parent), "__path__", None) if parent else None
        modules = [mi.name for mi in pkgutil.iter_modules(folders)] if folders or not parent else []
        close = suggest(leaf, modules, n=2)
        msg = f"press {path!r}: no module named {missing!r}"
        if close:
            msg += f" ({did_you_mean(f'{parent}.{c}' if parent else c for c in close)})"
        raise ConfigError(msg + "; the module must be importable: install its package, or add the folder that "
                          "holds it to PYTHONPATH") from None
    except FATAL:
        raise
    except (Exception, SystemExit) as e:  # a module that raises (or exits) while it is imported: the user's code
        raise ConfigError(f"press {path!r}: importing module {mod_name!r} failed: {error_reason(e)}") from None


def _is_press_class(obj: Any) -> bool:
    from kvpress import ScorerPress

    return isinstance(obj, type) and issubclass(obj, ScorerPress | Scorer) and obj not in (ScorerPress, Scorer)


def _what(obj: Any) -> str:
    """``obj`` in a few words, for "X is ..., not a press class"."""
    from kvpress import ScorerPress

    if isinstance(obj, ModuleType):
        return f"the module {obj.__name__}"
    if isinstance(obj, type):
        return f"the class {obj.__qualname__}"
    if isinstance(obj, FunctionType):
        return f"the function {obj.__qualname__}"
    if isinstance(obj, ScorerPress | Scorer):
        return f"an instance of {type(obj).__qualname__} (name the class; parameters go in [key=value])"
    return f"{with_article(type(obj).__name__)} value"


def scorer_class(name: str, obj: Any, origin: str) -> type[Scorer]:
    """The kvroute scorer class named ``name`` for ``obj`` (a ScorerPress or Scorer subclass), or a one-line error."""
    from kvpress import BasePress, ScorerPress

    if obj in (Scorer, ScorerPress):
        raise ConfigError(f"{origin} is the base class {obj.__qualname__} itself; name a subclass of it that "
                          "implements score()")
    if isinstance(obj, type) and issubclass(obj, Scorer):
        if inspect.isabstract(obj):
            raise ConfigError(f"{origin}: {obj.__qualname__} is abstract (it does not implement "
                              f"{', '.join(sorted(obj.__abstractmethods__))})")
        # a subclass named by the user's string: records and cell keys say what the user wrote
        return fenced(type(obj.__name__, (obj,), {"name": name, "__module__": obj.__module__,
                                                  "__qualname__": obj.__qualname__,
                                                  "description": _description(obj)}), origin)
    if isinstance(obj, type) and issubclass(obj, ScorerPress):
        if getattr(obj, "score", None) is ScorerPress.score:  # kvpress is untyped: no narrowing
            raise ConfigError(f"{origin}: {obj.__qualname__} does not implement score()")
        required = [f.name for f in fields(obj) if f.init and f.default is MISSING and f.default_factory is MISSING]
        if required:
            raise ConfigError(f"{origin}: {obj.__qualname__}'s field(s) {', '.join(required)} have no default; "
                              "kvroute builds a press from defaults plus [key=value], so give each a default")
        return fenced(kvpress_scorer(name, obj, _description(obj), **_options(obj, origin)), origin)
    if isinstance(obj, type) and issubclass(obj, BasePress):
        raise ConfigError(f"{origin} is the kvpress press {obj.__qualname__}, which is not a ScorerPress: kvroute "
                          f"needs a press's score(); accepted: {ACCEPTED}")
    raise ConfigError(f"{origin} is {_what(obj)}, not a press class; accepted: {ACCEPTED}")


def _options(press_cls: type, origin: str) -> dict[str, Any]:
    """``kvroute_options`` of an outside ScorerPress, with ``ratio_dependent`` True unless it says otherwise."""
    given = getattr(press_cls, "kvroute_options", {})
    if not isinstance(given, Mapping):
        raise ConfigError(f"{origin}: kvroute_options must be a dict of kvpress_scorer keywords, got {given!r}")
    allowed = [p for p in inspect.signature(kvpress_scorer).parameters if p not in ("name", "press_cls", "description")]
    for k in given:
        if k not in allowed:
            close = suggest(str(k), allowed)
            hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else f"allowed: {', '.join(allowed)}"
            raise ConfigError(f"{origin}: unknown key {k!r} in kvroute_options; {hint}")
    return {"ratio_dependent": True, **given}


def _description(cls: type) -> str:
    """The first line of the class's own docstring ("" for dataclass's generated signature)."""
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "")
    first = doc.splitlines()[0] if doc else ""
    return "" if first.startswith(f"{cls.__name__}(") else first


def source(name: str) -> str:
    """Where a scorer name comes from: kvroute, kvpress, plugin DIST, or import path."""
    if name in SCORERS:
        return "kvpress" if issubclass(SCORERS.get(name), KvpressScorer) else "kvroute"
    if is_import_path(name):
        return "import path"
    plugin = next((p for p in plugins() if p.name == name and p.problem is None), None)
    return f"plugin {plugin.dist}" if plugin is not None else "unknown"


def _outside(name: str) -> type[Scorer] | None:
    """An import path or installed plugin; a kvpress press kvroute does not offer raises its reason (catalogue)."""
    from kvroute.presses.catalogue import unavailable

    found = outside_scorer(name)
    if found is None and (why := unavailable(name)) is not None:
        raise why
    return found


SCORERS.fall_back_to(_outside, plugin_names)
