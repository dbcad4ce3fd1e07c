"""The detectors: one module per kind of finding (HTA style). Each exposes
`detect(ctx) -> list[Finding]` over a loaded run (its tables, manifest and
progress) and states its signal, threshold and why in its docstring;
run_structure holds the helpers several share (robust statistics, stages).
Which detectors run, and in what order, is diagnose/analysis/finding_kinds.py's
registry; run_detectors runs them."""
