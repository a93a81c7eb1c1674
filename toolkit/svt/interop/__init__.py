"""Interop: read the traces and suites other tools write, and write what their tools read.

``svt import FORMAT PATH --out RUN`` turns a foreign trace into a run directory
(:func:`import_trace`); importers are a registry of small classes (``IMPORTERS``, name ->
``module:Class``, imported when used), so a new format is one new module and one line here.
``run.json`` records the source file (path and SHA-256), the format and what it lacks.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from svt.errors import ConfigError
from svt.interop.base import (
    Imported,
    Importer,
    ImportFormatError,
    check_tables,
    read_mapping,
    write_imported,
)
from svt.traces.rundir import RunSummary

IMPORTERS = {
    "vllm-steps": "svt.interop.vllm_steps:VllmSteps",
    "specdec-tokens": "svt.interop.specdec_tokens:SpecDecTokens",
    "arctic-sim": "svt.interop.arctic_sim:ArcticSim",
    "table": "svt.interop.table:Table",
}


def get_importer(name: str) -> Importer:
    """The importer registered under ``name``; an unknown name lists the known ones."""
    if name not in IMPORTERS:
        raise ConfigError(f"Unknown import format {name!r}; known formats: {', '.join(IMPORTERS)}.")
    module, cls = IMPORTERS[name].split(":")
    return getattr(importlib.import_module(module), cls)()


def import_trace(fmt: str, path: str | Path, out: str | Path, *, mapping: str | Path | None = None,
                 overwrite: bool = False) -> RunSummary:
    """Read ``path`` as ``fmt`` and write it as the run directory ``out``. Everything is checked
    before anything is written; an existing ``out`` is replaced only with ``overwrite`` (the new
    run is written beside it and swapped in)."""
    importer = get_importer(fmt)
    path, out = Path(path), Path(out)
    if mapping is not None and not importer.takes_mapping:
        raise ConfigError(f"`{fmt}` takes no --mapping (only `table` does).")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"Output {str(out)!r} exists and is not a directory.")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise ConfigError(f"{out} is not empty; pass --overwrite to replace it.")
        if not (out / "run.json").is_file():
            raise ConfigError(f"Refusing to replace {out}: it is not a run directory. Choose another --out.")
    for given, what in ((path, "the trace"), (Path(mapping) if mapping is not None else None, "--mapping")):
        if given is not None and out.resolve() in given.resolve().parents:
            raise ConfigError(f"{what} {given} lies inside --out {out}, which the import replaces; move it out first.")
    imported = importer.read(path, read_mapping(Path(mapping)) if mapping is not None else None)
    check_tables(imported, str(path))
    return write_imported(imported, out, source_path=path, fmt=fmt)


__all__ = ["IMPORTERS", "ImportFormatError", "Imported", "Importer", "get_importer", "import_trace"]
