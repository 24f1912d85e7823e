"""The report: PNG figures and one self-contained ``report.html`` built from records.

Entry point: :func:`kvroute.report.build.build_report`. Figure modules import matplotlib, so this
package is imported only when a report is drawn.
"""
