"""Run directory -> tables -> findings, in one process, with no side effects but
the files under <run>/analysis/. In rooms that name the flow
(docs/architecture.md), each importing only rooms earlier in this list (load/,
replay/ and detectors/ not one another):

    tables/     derived tables: pure functions of frames (matching, breakdown,
                step_tables, gpu_tables, mfu, ...); imports no other room
    load/       a run directory -> Run: the per-rank pass on an engine, the event
                budget, clock alignment; the Run serves tables/ on demand
    replay/     the dependency model of the steps and the what-if (op_graph,
                step_replay, device_graph, whatif); on tables/
    detectors/  one module per kind of finding, the registry of kinds
                (finding_kinds) and the record they return (finding_record); on tables/
    findings/   the analysis step: every detector over a Run, impacts priced on
                the replay, findings.json and the tables written; on all above
    compare/    two runs or more: what changed, scaling, the regression gate

Enters: a run directory, read through diagnose.rundir (by load/ and findings/
only). Leaves: `diagnose.load(RUN)` -> Run, `diagnose.analyze(run)` -> findings
as dicts, analysis/*.parquet and findings.json; compare/'s summaries. Nothing
here imports dashboards, exporters, diagnose.run, diagnose.live or diagnose.cli
(tests/architecture/test_layout.py checks that and the rooms' arrows)."""
