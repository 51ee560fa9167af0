"""One exception type for user-facing mistakes.

Anything raised as `SpecctlError` is printed by the CLI as a one-line message (no traceback) and
exits non-zero. Code below the CLI raises it for bad input (files, lines, fields, checkpoints);
programming errors stay ordinary exceptions.
"""


class SpecctlError(Exception):
    """A user-facing error: the message names the file/line/field and what is wrong."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
