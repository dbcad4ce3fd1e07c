"""Per-rank collectors: record what a training process does, never analyse it.

Public API for code that wants explicit ranges: `phase`, `mark`. Everything else
is installed without code changes by `diagnose run` (see collectors.activate).
Imports nothing from diagnose/, dashboards/ or reference_trainer/.
"""

from collectors.phase import mark, phase
from collectors.recorder import get_recorder

__all__ = ["phase", "mark", "get_recorder"]
