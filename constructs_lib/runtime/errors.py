"""Errors the runtime CLI prints as one line (exit 2)."""


class RuntimeUserError(Exception):
    """Bad bucket, prefix, directory or setting: say what and how to fix it."""
