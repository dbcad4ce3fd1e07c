"""Plotly figures and the HTML report, built from the analysis tables of a loaded
run (`diagnose.load(RUN)`: steps(), breakdown(), collectives(), arrivals(),
events(), samples()) and its findings, never from trace files.

    from dashboards.report import write_report
    write_report(run, findings)          # -> <run>/report.html

One module per view (fig_*.py); each returns `Section`s that report.py lays out
under the findings summary. Every string that comes from a trace (range names,
callsites, hosts, finding titles) goes through `common.esc` before it reaches
HTML or a plotly label.
"""
