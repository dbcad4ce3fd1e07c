"""`phase` from collectors, or a do-nothing stand-in where collectors is absent
(the trainer must also run on a machine that only has this package)."""
try:
    from collectors import phase
except ImportError:  # pragma: no cover - collectors ships with this repo
    import functools

    class phase:  # type: ignore[no-redef]
        def __init__(self, name: str, microbatch: int | None = None, stage: int | None = None):
            self.name = name

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def __call__(self, fn):
            @functools.wraps(fn)
            def wrapped(*args, **kwargs):
                return fn(*args, **kwargs)
            return wrapped

__all__ = ["phase"]
