"""Errors meant for a person: one line, exit status 2, never a traceback."""


class UserError(Exception):
    """Misuse or unusable input; the message is the whole story."""
