"""The linear probe for representation degradation (see :mod:`kvroute.analysis.probe`).

The implementation lives in the analysis package so that reading records never imports the
model-side metrics (torch, transformers); this module is its home in the metrics namespace.
"""

from kvroute.analysis.probe import linear_probe_macro_f1, probe_by_ratio

__all__ = ["linear_probe_macro_f1", "probe_by_ratio"]
