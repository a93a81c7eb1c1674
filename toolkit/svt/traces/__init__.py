"""The trace schema and run-directory IO."""

from svt.traces.io import Run, open_run, read_meta, scan_runs, write_meta, write_shard
from svt.traces.schema import SCHEMA_VERSION, TABLES, get_table

__all__ = ["SCHEMA_VERSION", "TABLES", "Run", "get_table", "open_run", "read_meta", "scan_runs",
           "write_meta", "write_shard"]
