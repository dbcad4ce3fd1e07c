"""The detectors: one module per kind of finding (HTA style). Each exposes
`detect(ctx) -> list[Finding]` over a loaded run (its tables, manifest and
progress) and states its signal, threshold and why in its docstring;
run_structure holds the helpers several share (robust statistics, stages).
run_detectors runs them in DETECTORS order."""

DETECTORS = ("hang", "rank_failure", "straggler", "workload_imbalance", "stage_imbalance",
             "pipeline_bubble",
             "input_stall", "hidden_sync", "accumulation_sync", "blocking_async", "exposed_comm", "fp32_math", "copy_stall",
             "checkpoint_stall",
             "memory_imbalance",
             "env_mismatch")
