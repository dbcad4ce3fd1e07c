"""Errors meant for a person: one line, exit status 2, never a traceback."""


class UserError(Exception):
    """Misuse or unusable input; the message is the whole story."""


class NotAnalyzed(UserError):
    """The findings of a run no analysis has written findings for (Run.findings)."""
