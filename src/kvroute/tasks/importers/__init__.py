"""Import existing long-context datasets into kvroute's instance format.

Sources: local Parquet, CSV/TSV, JSONL or JSON files, or a Hugging Face dataset id (with config and
split, through ``datasets``; needs a reachable hub). Layouts, one module each, registered in
:data:`LAYOUTS` and detected from the columns (override with ``layout=``):

- ``kvpress`` — kvpress's evaluation layout: ``context``, ``question``, ``answer``
  (+ ``answer_prefix``, ``max_new_tokens``, ``task``);
- ``ruler`` — RULER's prepared data: ``input``, ``outputs`` (+ ``length``, ``answer_prefix``).

>>> from kvroute.tasks.importers import ImportOptions, import_tasks
>>> result = import_tasks("niah.jsonl", ImportOptions(layout="ruler"))      # doctest: +SKIP
>>> [c.as_dict() for c in result.summary]                                     # doctest: +SKIP
"""

from kvroute.tasks.importers import kvpress, ruler  # noqa: F401  (each module registers its layout)
from kvroute.tasks.importers.base import LAYOUTS, Layout, SourceRow, Where, detect_layout
from kvroute.tasks.importers.convert import IMPORT_VERSION, infer_answer_type, to_instance
from kvroute.tasks.importers.pipeline import ImportOptions, ImportResult, TaskCounts, import_tasks
from kvroute.tasks.importers.sources import read_source

__all__ = ["IMPORT_VERSION", "LAYOUTS", "ImportOptions", "ImportResult", "Layout", "SourceRow", "TaskCounts", "Where",
           "detect_layout", "import_tasks", "infer_answer_type", "read_source", "to_instance"]
