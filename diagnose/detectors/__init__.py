"""One module per concern (HTA style). Each exposes `detect(ctx) -> list[Finding]`
and states its signal, threshold and why in its docstring."""

DETECTORS = ()
