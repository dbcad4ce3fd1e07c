"""Plotly figures and the HTML report, built from the analysis tables of a loaded
run (`diagnose.load(RUN)`: steps(), breakdown(), collectives(), arrivals(),
events(), samples()) and its findings, never from trace files.

    from dashboards.report_page import write_report
    write_report(run, findings)          # -> <run>/report.html

One module per view (fig_*.py); each returns `Section`s that report_page lays out
under the findings summary; compare_page draws `diagnose compare --html`. Every
string that comes from a trace (range names, callsites, hosts, finding titles)
goes through `view_parts.esc` before it reaches HTML or a plotly label.

Enters: diagnose.analysis tables and findings (and diagnose.rundir names). Leaves:
HTML pages. Imports nothing else of diagnose (tests/architecture/test_layout.py).
"""
