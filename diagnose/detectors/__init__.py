"""One module per concern (HTA style). Each exposes `detect(ctx) -> list[Finding]`
and states its signal, threshold and why in its docstring."""

DETECTORS = ("hang", "rank_failure", "straggler", "stage_imbalance", "pipeline_bubble",
             "input_stall", "hidden_sync", "blocking_async", "exposed_comm", "memory_imbalance")
