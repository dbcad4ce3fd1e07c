"""An uncaught exception in the rank: type, message and the innermost user
frame go into meta.json before the original excepthook runs, so a crashed rank
says why it died."""

import sys
import traceback

from collectors.callsite import is_user_frame
from collectors.clock import now_ns


def install(rec):
    previous = sys.excepthook

    def excepthook(exc_type, exc, tb):
        try:
            callsite = None
            for frame, lineno in traceback.walk_tb(tb):
                if is_user_frame(frame):
                    callsite = f"{frame.f_code.co_filename}:{lineno}"
            rec.meta["exception"] = {
                "type": exc_type.__name__,
                "message": str(exc)[:500],
                "callsite": callsite,
                "step": rec.state.step,
                "mono_ns": now_ns(),
            }
            rec.write_meta()
        except Exception:
            pass
        previous(exc_type, exc, tb)

    sys.excepthook = excepthook
