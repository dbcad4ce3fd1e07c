"""Small shared helpers for detectors: the run's structure as its job states it."""


def layers_per_stage(manifest: dict, n_stages: int) -> list[int] | None:
    """Layer counts per stage from the job's own flags, when it states them."""
    argv = [str(a) for a in manifest.get("argv", [])]

    def flag(name):
        for i, arg in enumerate(argv[:-1]):
            if arg == name:
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
        for arg in argv:
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
        return None

    explicit = flag("--layers-per-stage")
    if explicit:
        try:
            counts = [int(x) for x in explicit.split(",")]
            return counts if len(counts) == n_stages else None
        except ValueError:
            return None
    layers = flag("--layers")
    if layers and layers.isdigit() and n_stages and int(layers) % n_stages == 0:
        return [int(layers) // n_stages] * n_stages
    return None
