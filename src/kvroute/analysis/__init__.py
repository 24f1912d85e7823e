"""Analysis of cell records: cliff fits, susceptibility, bootstrap intervals, correlations, decomposition.

Modules hold one responsibility each and work on pandas DataFrames of records (see
:mod:`kvroute.records`); :func:`kvroute.analysis.summary.analyze` runs them all.
"""
