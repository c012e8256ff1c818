"""The errors that end a command with one line and exit status 2 (``cli.run_main``), beside
``minbert.CheckpointError``."""


class UsageError(Exception):
    """A bad flag or setting: entry points print it as one line and exit with status 2."""


class NonFiniteLossError(Exception):
    """The loss became NaN or infinite, or diverged (``training.DIVERGENCE_FACTOR``); the last good
    checkpoint is kept."""


class WriteError(Exception):
    """A file or checkpoint could not be written (no space, quota, read-only, no permission); the
    temporary copy is removed and the previous version is intact (``files``)."""


class DataError(Exception):
    """Bad or missing input data.  ``str(error)`` is one line meant for the user."""
