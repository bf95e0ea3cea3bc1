"""Errors the runtime CLI prints as one line (exit 2)."""


class RuntimeUserError(Exception):
    """Bad bucket, prefix, directory or setting: say what and how to fix it."""


class ImdsUnavailable(OSError):
    """IMDS did not answer in time, every try: the node is busy or throttled, not misconfigured."""
