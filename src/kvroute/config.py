"""Config files: read a TOML, YAML or JSON mapping, apply ``--set key=value`` overrides, check keys.

Files are data, never code (``tomllib``, ``yaml.safe_load``, ``json``). Every error is a
:class:`~kvroute.errors.ConfigError` that names the file, the key and the allowed values, so a
user can fix a config without reading kvroute's source. The typed, frozen configs built from
these mappings live next to what they configure (e.g. :mod:`kvroute.sweep.config`).
"""

from __future__ import annotations

import copy
import json
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kvroute.errors import ConfigError, suggest

#: the longest answer, in new tokens, wherever a command, a config or a settings object does not say (the synthetic
#: tasks' answers are a few tokens; a model that rambles is cut after a sentence). Every default names this.
DEFAULT_MAX_NEW_TOKENS = 24


def check_max_new_tokens(value: object, name: str = "max_new_tokens") -> int:
    """``value`` as a number of new tokens (an int ≥ 1); otherwise ConfigError naming ``name`` (option or key)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a whole number of new tokens, at least 1; got {value!r}")
    return value

SUFFIXES = (".toml", ".yaml", ".yml", ".json")


def load_mapping(path: str | Path) -> dict[str, Any]:
    """The top-level mapping of a ``.toml``, ``.yaml``/``.yml`` or ``.json`` file."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such config file")
    suffix = p.suffix.lower()
    if suffix not in SUFFIXES:
        raise ConfigError(f"{p}: unknown config format {suffix or '(no suffix)'!r}; use one of {', '.join(SUFFIXES)}")
    try:
        text = p.read_text(encoding="utf-8-sig")  # a byte-order mark is no content
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read the config file ({e})") from None
    from kvroute.bounds import MAX_DEPTH, value_problem

    try:
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: invalid TOML: {e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p}: invalid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise ConfigError(f"{p}: is nested more than {MAX_DEPTH} levels deep; a sweep config is a few tables "
                          "deep") from None
    except Exception as e:  # yaml.YAMLError carries its own line/column
        raise ConfigError(f"{p}: invalid YAML: {e}") from None
    if data is None:
        data = {}
    problem = value_problem(data)
    if problem:
        raise ConfigError(f"{p}: {problem}")
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of keys to values, got {type(data).__name__}")
    return data


def parse_value(text: str) -> Any:
    """A command-line value read as a TOML value (``0.5``, ``true``, ``[0, 0.5]``, ``"x"``), else the raw text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: Mapping[str, Any], overrides: Iterable[str]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A copy of ``data`` with each ``dotted.key=value`` applied; also returns the keys that were set.

    Path parts that are integers index lists (``tasks.0.n=5``); missing tables are created.
    """
    out = copy.deepcopy(dict(data))
    keys: list[str] = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: write KEY=VALUE, e.g. --set decoding.max_new_tokens=16")
        key, raw = (s.strip() for s in item.split("=", 1))
        parts = key.split(".")
        if not key or not all(parts):
            raise ConfigError(f"--set {item!r}: the key must be dotted names, e.g. decoding.max_new_tokens")
        node: Any = out
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            here = ".".join(parts[: i + 1])
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(f"--set {key}: {here!r} is not an index of the list (0..{len(node) - 1})")
                if last:
                    node[int(part)] = parse_value(raw)
                else:
                    node = node[int(part)]
            elif isinstance(node, dict):
                if last:
                    node[part] = parse_value(raw)
                else:
                    node = node.setdefault(part, {})
            else:
                raise ConfigError(f"--set {key}: {'.'.join(parts[:i])!r} holds a value, not a table")
        keys.append(key)
    return out, tuple(keys)


def check_keys(mapping: Mapping[str, Any], allowed: Sequence[str], where: str, table: str = "") -> None:
    """Unknown keys fail with the closest allowed ones (``where`` names the file, ``table`` the section)."""
    for k in mapping:
        if k not in allowed:
            close = suggest(str(k), allowed)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "."
            at = f"{table}.{k}" if table else str(k)
            raise ConfigError(f"{where}: unknown key {at!r}{hint} Allowed keys{' in ' + table if table else ''}: "
                              f"{', '.join(allowed)}.")
