"""Errors with messages meant for the user, raised instead of deep library traces."""


class GencraftError(Exception):
    """Base class: the message says what is wrong and what to do about it."""


class ModelLoadError(GencraftError, OSError):
    """A model name or path cannot be resolved or loaded."""


class DataError(GencraftError, OSError):
    """A dataset cannot be found, downloaded or parsed."""


class ConfigError(GencraftError, ValueError):
    """A configuration value is invalid (also a ``ValueError``, as configs raised before)."""
