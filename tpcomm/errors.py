"""Errors a user can fix. The CLI turns them into a message and exit code 2."""


class InputError(ValueError):
    """Bad user input: names the input and what was expected."""

    def __init__(self, what: str, problem: str, expected: str | None = None):
        self.what = what
        self.problem = problem
        self.expected = expected
        msg = f"{what}: {problem}"
        if expected:
            msg += f" (expected {expected})"
        super().__init__(msg)

    def __reduce__(self):
        # Picklable, so that an error in a worker process (trace ranks) reaches the caller: as an InputError
        # with the same message (subclasses' own __init__ take other arguments).
        return (InputError, (self.what, self.problem, self.expected))
