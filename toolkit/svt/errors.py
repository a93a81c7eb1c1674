"""The few error types svt raises for bad input; the CLI turns them into one message + exit code."""


class SvtError(Exception):
    """Base class: a problem the user can fix (bad file, bad option, bad data)."""

    exit_code = 1


class ConfigError(SvtError):
    """A configuration file or option is invalid."""

    exit_code = 2


class SchemaError(SvtError):
    """A trace file does not follow the svt trace schema."""

    exit_code = 3


class ModelLoadError(SvtError):
    """A model or tokenizer could not be loaded, or a target/draft pair does not match."""

    exit_code = 4


class DataError(SvtError):
    """The data cannot give the asked-for result (no labelled drafts, no dists table, ...)."""

    exit_code = 5


class IncomparableError(SvtError):
    """Two reports cannot be compared (different schema, runs, K, features or settings)."""

    exit_code = 6
