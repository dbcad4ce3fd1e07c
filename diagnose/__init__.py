"""diagnose: find why a distributed PyTorch training job is slow or hung.

import diagnose
run = diagnose.load("runs/my-run")     # loads: the tables, on one clock
run.breakdown(); run.arrivals()
findings = diagnose.analyze(run)       # analyses: every detector, impacts replayed
run.findings                           # reads: analyze's, else analysis/findings.json
"""

__all__ = ["load", "analyze", "Run"]
__version__ = "0.1.0"


def __getattr__(name):
    # on first use: the loader imports pandas (~0.3 s), which `diagnose run`'s
    # launcher and a Kineto import's parse workers never need
    if name == "analyze":
        from diagnose.analysis.findings.run_detectors import analyze

        globals()["analyze"] = analyze
        return analyze
    if name in __all__:
        from diagnose.analysis.load import loader

        globals().update(load=loader.load, Run=loader.Run)
        return globals()[name]
    raise AttributeError(f"module 'diagnose' has no attribute {name!r}")
