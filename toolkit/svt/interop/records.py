"""Reading foreign record files: JSON Lines, a JSON list, CSV or Parquet, each record with where it
came from (file and line or row), so an error names the first offending record."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from svt.errors import ConfigError
from svt.fileio import json_objects
from svt.interop.base import COUNT_MAX, fail  # noqa: F401  (COUNT_MAX: the importers' bound)


def json_records(path: Path) -> Iterator[tuple[str, dict]]:
    """(where, record) of a JSON Lines file, or of a JSON file holding a list of objects; a file
    not in that form is an ImportFormatError naming the first offending record."""
    check_file(path)
    return json_objects(path, fail)


def check_file(path: Path) -> None:
    """A readable input file, or one clear error."""
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory; give the trace file.")
    if not path.is_file():
        raise ConfigError(f"{path}: not found.")


def table_file(path: Path) -> pl.DataFrame:
    """A CSV or Parquet file (by its suffix) as a frame."""
    check_file(path)
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            return pl.read_parquet(path)
        if suffix in (".csv", ".tsv"):
            return pl.read_csv(path, separator="\t" if suffix == ".tsv" else ",", infer_schema_length=10_000)
        if suffix in (".jsonl", ".ndjson"):
            return pl.read_ndjson(path)
    except Exception as exc:  # polars' parse errors: one message naming the file
        raise fail(str(path), f"not a readable {suffix[1:]} file ({type(exc).__name__}: {str(exc).splitlines()[0]}).") \
            from None
    raise ConfigError(f"{path}: expected a .csv, .tsv, .parquet or .jsonl file.")


TOKEN_MAX = 2**31 - 1  # token ids are stored as 32-bit integers


def int_list(value, where: str, key: str, *, bound: int = TOKEN_MAX) -> list[int]:
    """A list of integers in [0, bound] from a record, or one clear error."""
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise fail(where, f"`{key}` must be a list of integers, but got {json.dumps(value)[:80]}.")
    bad = next((x for x in value if not 0 <= x <= bound), None)
    if bad is not None:
        raise fail(where, f"`{key}` holds {bad}, outside [0, {bound}].")
    return value


def label(value, where: str, key: str) -> str:
    """A workload label: a string (or a number, written as text)."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise fail(where, f"`{key}` must be a string, but got {json.dumps(value)[:80]}.")
    return str(value)


def row_where(path: Path, i: int) -> str:
    """A table file's row, as a person counts it (the header is line 1 of a CSV)."""
    return f"{path} row {i + 1}" + (f" (line {i + 2})" if path.suffix.lower() in (".csv", ".tsv") else "")
