"""The one exception type that reaches the user as a one-line message and a non-zero exit."""


class DLProfError(Exception):
    """A problem with the user's input or environment, phrased for the user."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self):  # raised in a worker process, re-raised in the parent with its exit code
        return (type(self), (str(self), self.exit_code))
