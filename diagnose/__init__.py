"""diagnose: find why a distributed PyTorch training job is slow or hung.

    import diagnose
    run = diagnose.load("runs/my-run")
    run.breakdown(); run.arrivals(); run.findings
"""
__all__ = ["load", "Run"]
__version__ = "0.1.0"


def __getattr__(name):
    # on first use: the loader imports pandas (~0.3 s), which `diagnose run`'s
    # launcher and a Kineto import's parse workers never need
    if name in __all__:
        from diagnose.analysis import loader
        globals().update(load=loader.load, Run=loader.Run)
        return globals()[name]
    raise AttributeError(f"module 'diagnose' has no attribute {name!r}")
