"""The training side's one error type, in a module of its own so that argument parsing
(trainer/args.py) and data loading (trainer/dataset.py) can both raise it without importing each
other."""


class UsageError(ValueError):
    """A bad flag or input, reported as one line and exit status 2 before any model loads."""
