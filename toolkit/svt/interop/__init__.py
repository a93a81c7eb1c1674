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
from svt.traces.rundir import RunSummary, check_run_out

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
    inputs = {"the trace": path, **({"--mapping": Path(mapping)} if mapping else {})}
    check_run_out(out, overwrite, inputs)  # fails fast; checked again while the output is held
    imported = importer.read(path, read_mapping(Path(mapping)) if mapping is not None else None)
    check_tables(imported, str(path))
    return write_imported(imported, out, source_path=path, fmt=fmt, overwrite=overwrite, inputs=inputs)


__all__ = ["IMPORTERS", "ImportFormatError", "Imported", "Importer", "get_importer", "import_trace"]
