"""All threads' Python stacks as data (for hang dumps), innermost frame last."""

import sys
import threading
import traceback

from collectors.callsite import is_user_frame


def thread_stacks() -> list[dict]:
    names = {t.ident: t.name for t in threading.enumerate()}
    stacks = []
    for ident, frame in sys._current_frames().items():
        user_frame = None
        walker = frame
        while walker is not None:
            if is_user_frame(walker):
                user_frame = f"{walker.f_code.co_filename}:{walker.f_lineno}"
                break
            walker = walker.f_back
        stacks.append(
            {
                "thread": names.get(ident, str(ident)),
                "main": ident == threading.main_thread().ident,
                "innermost_user_frame": user_frame,
                "stack": [f"{fs.filename}:{fs.lineno} in {fs.name}" for fs in traceback.extract_stack(frame)],
            }
        )
    return stacks
