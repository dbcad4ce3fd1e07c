"""diagnose: find why a distributed PyTorch training job is slow or hung.

    import diagnose
    run = diagnose.load("runs/my-run")
    run.breakdown(); run.arrivals(); run.findings
"""
from diagnose.load import Run, load

__all__ = ["load", "Run"]
__version__ = "0.1.0"
