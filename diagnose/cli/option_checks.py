"""Checks of `diagnose` options' values: a wrong one is a UserError (one line, exit 2)."""

from diagnose.errors import UserError


def hang_timeout_option(text: str) -> float | None:
    if text.strip().lower() == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise UserError(f"--hang-timeout {text!r}: give auto or a number of seconds") from None
    if value < 0:
        raise UserError("--hang-timeout must be >= 0 (0: no hang watchdog)")
    return value


def steps_option(spec):
    if spec is None:
        return None
    from collectors.profiler_window import parse_window

    try:
        first, last = parse_window(spec)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return f"{first}-{last}"


def require_local(command: str, *run_dirs: str) -> None:
    """Only `diagnose analyze` reads a run at a URL (docs/large-runs.md)."""
    from diagnose.rundir.storage import is_url

    for run_dir in run_dirs:
        if is_url(run_dir):
            raise UserError(
                f"{run_dir}: diagnose {command} needs a local run directory "
                "(a run at a URL is analyzed by `diagnose analyze`)"
            )
