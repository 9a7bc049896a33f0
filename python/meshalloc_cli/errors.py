"""Errors the command reports as one line on stderr, and the exit codes it uses.

The codes follow the conventions of env(1) and the shell, so a script can tell a bad
invocation of meshalloc from a failure of the program it measured.
"""

EXIT_OK = 0
EXIT_FAILURE = 1  # meshalloc itself failed at run time (e.g. apt-get failed)
EXIT_USAGE = 2  # bad option, unknown allocator, missing command, unwritable output
EXIT_CANNOT_EXECUTE = 126  # the command exists but cannot be executed (shell convention)
EXIT_NOT_FOUND = 127  # the command does not exist (shell convention)
EXIT_SIGNAL_BASE = 128  # a command killed by signal N is reported as 128 + N (shell convention)


class MeshallocError(Exception):
    """A problem meshalloc reports as a single line and an exit code, never a traceback."""

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message
