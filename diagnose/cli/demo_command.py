"""`diagnose demo`: the reference trainer with one injected problem per scenario."""

import sys

from diagnose.errors import UserError


def demo_command(scenario: str) -> list:
    try:
        from reference_trainer.scenarios import SCENARIOS
    except ImportError as exc:
        raise UserError(f"the reference trainer is not available: {exc}") from None
    if scenario not in SCENARIOS:
        raise UserError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
    spec = SCENARIOS[scenario]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(spec.nproc),
        "-m",
        "reference_trainer",
        *spec.argv,
    ]
