"""Small shared helpers for detectors: robust statistics and run structure."""
import numpy as np


def mad(values) -> float:
    """Median absolute deviation scaled to a standard deviation for normal data."""
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(values - np.median(values))))


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
