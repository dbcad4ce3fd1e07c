"""The user's line that caused an event: the first frame outside torch, the
Python runtime's own helpers, and this project's collectors.

Frames are classified by filename once and cached, so a lookup is a short walk
up `f_back` with dict hits.
"""

import os
import sys

_PROJECT_DIRS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), d) + os.sep
    for d in ("collectors", "diagnose")
)
_STDLIB_DIR = os.path.dirname(os.__file__) + os.sep
_TORCH_PART = f"{os.sep}torch{os.sep}"
INTERNAL_FILES: dict = {}  # filename -> is internal; hot paths may .get() it before calling is_internal


def is_internal(filename: str) -> bool:
    hit = INTERNAL_FILES.get(filename)
    if hit is None:
        in_stdlib = filename.startswith(_STDLIB_DIR) and "-packages" not in filename
        hit = filename.startswith(_PROJECT_DIRS) or filename.startswith("<") or in_stdlib or _TORCH_PART in filename
        INTERNAL_FILES[filename] = hit
    return hit


def is_user_frame(frame) -> bool:
    return not is_internal(frame.f_code.co_filename)


def user_callsite(depth: int = 2) -> str:
    """`file:line` of the first user frame above the caller, or ""."""
    frame = sys._getframe(depth)
    while frame is not None:
        if not is_internal(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return ""
