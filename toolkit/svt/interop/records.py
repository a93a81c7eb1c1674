"""Reading foreign record files: JSON Lines, a JSON list, CSV or Parquet, each record with where it
came from (file and line or row), so an error names the first offending record."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl

from svt.errors import ConfigError
from svt.interop.base import fail


def json_records(path: Path) -> Iterator[tuple[str, dict]]:
    """(where, record) of a JSON Lines file, or of a JSON file holding a list of objects."""
    if not path.is_file():
        raise ConfigError(f"{path}: not found.")
    text = path.read_text(encoding="utf-8", errors="strict") if path.stat().st_size < (1 << 31) else None
    if text is None:
        raise ConfigError(f"{path}: larger than 2 GiB; split it.")
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise fail(str(path), f"not valid JSON ({exc.msg} at line {exc.lineno}).") from None
        for i, obj in enumerate(data):
            where = f"{path} record {i + 1}"
            if not isinstance(obj, dict):
                raise fail(where, f"expected a JSON object, but got {type(obj).__name__}.")
            yield where, obj
        return
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise fail(where, f"not valid JSON ({exc.msg}).") from None
        if not isinstance(obj, dict):
            raise fail(where, f"expected a JSON object, but got {type(obj).__name__}.")
        yield where, obj


def table_file(path: Path) -> pl.DataFrame:
    """A CSV or Parquet file (by its suffix) as a frame."""
    if not path.is_file():
        raise ConfigError(f"{path}: not found.")
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


def int_list(value, where: str, key: str, *, non_negative: bool = True) -> list[int]:
    """A list of integers from a record, or one clear error."""
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise fail(where, f"`{key}` must be a list of integers, but got {json.dumps(value)[:80]}.")
    if non_negative and any(x < 0 for x in value):
        raise fail(where, f"`{key}` holds a negative number.")
    return value


def row_where(path: Path, i: int) -> str:
    """A table file's row, as a person counts it (the header is line 1 of a CSV)."""
    return f"{path} row {i + 1}" + (f" (line {i + 2})" if path.suffix.lower() in (".csv", ".tsv") else "")
