"""Routing metrics: retention, accessibility/reachability, consensus, utilization, hallucination, representation.

``METRICS`` maps a metric's name (as a sweep config lists it) to the metric; :func:`cell_records`
(kvroute.metrics.records) turns an engine result into one record per cell.
"""

from kvroute.metrics import accessibility, consensus, hallucination, representation, retention, retrieval  # noqa: F401
from kvroute.metrics.base import METRICS, CellContext, Metric, MetricSettings

DEFAULT_METRICS = ("retention", "accessibility", "routes", "consensus", "utilization", "representation")

__all__ = ["DEFAULT_METRICS", "METRICS", "CellContext", "Metric", "MetricSettings"]
