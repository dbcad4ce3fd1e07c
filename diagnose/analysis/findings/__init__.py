"""The analysis step, at the end of the flow: every detector over a loaded run
(run_detectors: `diagnose.analyze`, and `write_analysis`, what `diagnose
analyze` writes), each finding's impact priced on the replay (finding_impacts,
the step's waterfall in step_waterfall), what it is worth in GPU-hours
(gpu_hours), and a run over the event budget analyzed window by window
(window_findings).

May import: tables/, load/, replay/, detectors/, diagnose.rundir
(tests/architecture/test_layout.py)."""
