"""The detectors: one module per kind of finding (HTA style). Each exposes
`detect(ctx) -> list[Finding]` over a loaded run (its tables, manifest and
progress) and states its signal, threshold and why in its docstring;
run_structure holds the helpers several share (robust statistics, layers per
stage). finding_kinds is the registry: which detectors run, in what order, and
how each kind is labelled and priced; finding_record is the record a detector
returns (findings.json's schema) and severity from impact. findings/run_detectors
runs them.

May import: tables/ (tests/architecture/test_layout.py); it gets a loaded run and reads no
run directory."""
