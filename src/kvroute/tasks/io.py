"""Reading and writing task files: JSONL (one instance per line) or a JSON list.

``save_tasks`` writes byte-stable files: fixed key order, ``ensure_ascii=False``, compact
separators, ``\\n`` line endings, UTF-8, so the same instances always give the same bytes.
``load_tasks`` validates every line and fails on the first bad one with its line number and field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from kvroute.bounds import loads_json
from kvroute.errors import TaskFormatError
from kvroute.files import atomic_write
from kvroute.tasks.instance import TaskInstance


def save_tasks(instances: Iterable[TaskInstance], path: str | os.PathLike[str]) -> int:
    """Write ``instances`` as JSONL to ``path`` (parent folders created); returns the number written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with atomic_write(path, "w", encoding="utf-8", newline="\n") as f:
        for inst in instances:
            f.write(inst.to_json())
            f.write("\n")
            n += 1
    return n


def dumps_tasks(instances: Iterable[TaskInstance]) -> str:
    """The exact text :func:`save_tasks` would write."""
    return "".join(inst.to_json() + "\n" for inst in instances)


def load_tasks(path: str | os.PathLike[str]) -> list[TaskInstance]:
    """Read and validate a ``.jsonl`` file (or a ``.json`` file holding a list of instances).

    Raises :class:`~kvroute.errors.TaskFormatError` naming the file, the line (for JSON lists: the
    1-based item number) and the field of the first problem, and on duplicate ids.
    """
    p = Path(path)
    if not p.is_file():
        raise TaskFormatError("no such file; give a .jsonl task file (see `kvroute tasks generate`)", path=str(p))
    try:
        text = p.read_text(encoding="utf-8-sig")  # a byte-order mark (Windows editors, Excel) is no content
    except UnicodeDecodeError as e:
        raise TaskFormatError(f"not UTF-8 text ({e.reason} at byte {e.start})", path=str(p)) from None
    out: list[TaskInstance] = []
    lines: list[int] = []
    if p.suffix.lower() == ".json":
        try:
            items = loads_json(text)
        except json.JSONDecodeError as e:
            raise TaskFormatError(f"invalid JSON: {e.msg} (column {e.colno})", path=str(p), line=e.lineno) from None
        except ValueError as e:
            raise TaskFormatError(f"the JSON {e}", path=str(p)) from None
        if not isinstance(items, list):
            raise TaskFormatError("a .json task file must hold a list of instances (or use .jsonl)", path=str(p))
        for i, item in enumerate(items, start=1):
            out.append(TaskInstance.from_dict(item, path=str(p), line=i))
            lines.append(i)
    else:
        for lineno, line in enumerate(text.split("\n"), start=1):
            if not line.strip():
                continue
            try:
                item = loads_json(line)
            except json.JSONDecodeError as e:
                raise TaskFormatError(f"invalid JSON: {e.msg} (column {e.colno})", path=str(p),
                                      line=lineno) from None
            except ValueError as e:
                raise TaskFormatError(f"the JSON {e}", path=str(p), line=lineno) from None
            out.append(TaskInstance.from_dict(item, path=str(p), line=lineno))
            lines.append(lineno)
    seen: dict[str, int] = {}
    for inst, lineno in zip(out, lines, strict=True):
        if inst.id in seen:
            raise TaskFormatError(f"duplicate id {inst.id!r} (first on line {seen[inst.id]}); ids must be unique "
                                  "within a file", path=str(p), line=lineno, field="id")
        seen[inst.id] = lineno
    return out
