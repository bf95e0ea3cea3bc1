"""The CLI's user error: printed as one line, exit 2."""


class CliError(Exception):
    pass
