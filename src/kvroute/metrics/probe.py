"""The representation probes (see :mod:`kvroute.analysis.probe`).

The answer-identity probe (:func:`identity_probe`, :func:`identity_by_ratio`) reads which candidate
value is the answer from the logit lens and can fail when the evidence is gone; the answer-type
probe (:func:`linear_probe_macro_f1`, :func:`probe_by_ratio`) is a control that reads the question.
The implementation lives in the analysis package so that reading records never imports the
model-side metrics (torch, transformers); this module is its home in the metrics namespace.
"""

from kvroute.analysis.probe import identity_by_ratio, identity_probe, linear_probe_macro_f1, probe_by_ratio

__all__ = ["identity_by_ratio", "identity_probe", "linear_probe_macro_f1", "probe_by_ratio"]
