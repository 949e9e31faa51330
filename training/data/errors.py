"""The data errors that come from what a user asked for, not from a bug: a data slice too small for the run, a data
set not installed.

``otzoo`` maps exactly these (with its own ``CommandError``) to one line and exit status 2; any other exception,
a plain ``ValueError`` included, is a bug and keeps its traceback. Both subclass the built-in error a caller
would otherwise expect (``ValueError``, ``FileNotFoundError``), so code catching those keeps working.
"""


class EmptySliceError(ValueError):
    """The data slice a run was asked for is too small for it: the first ``limit`` images leave fewer than one
    batch, a class split of them leaves too few classes or images, or the episodes they must supply cannot be
    drawn.

    ``EmptySliceError(detail, parameter="limit", value=5)``: ``parameter`` names the argument that made the slice
    (``otzoo`` prints it as the option ``--limit``) and ``value`` is what it was given; without ``parameter`` the
    message is ``detail`` alone.
    """

    def __init__(self, detail, parameter=None, value=None):
        self.detail, self.parameter, self.value = detail, parameter, value
        super().__init__(detail if parameter is None else f"`{parameter}` {value}: {detail}")

    def option_message(self):
        """The message with the parameter spelled as a command-line option (``--limit 5: ...``)."""
        if self.parameter is None:
            return self.detail
        return f"--{self.parameter.replace('_', '-')} {self.value}: {self.detail}"


class DataUnavailableError(FileNotFoundError):
    """A data set is not installed or prepared on this machine; the message says how to get it."""
