"""``table``: any CSV, TSV, Parquet or JSON Lines file of drafts or steps, read through a
column-mapping YAML (the escape hatch for every format svt does not know by name).

The mapping names what the file's rows are and which of its columns hold svt's columns::

    rows: drafts            # one row per draft token (or: steps, one per request and step)
    columns:                # svt column: the file's column
      request: req_id
      step: iteration
      position: pos
      label: accepted       # 1 accepted, 0 rejected, empty never verified
      q_max: draft_conf     # any other column of svt's drafts table, when the file has it
    workload: category      # optional: the file's column that names each row's workload

Rows of ``drafts`` need ``request``, ``step``, ``position`` and ``label``; rows of ``steps`` need
``request``, ``step``, ``drafted`` and ``accepted`` (their drafts are the chain these counts give).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from svt.errors import ConfigError
from svt.interop.base import COUNT_MAX, Imported, Importer, chain_drafts, fail, steps_from_drafts
from svt.interop.records import row_where, table_file
from svt.traces.schema import TABLES

NEEDS = {"drafts": ("request", "step", "position", "label"), "steps": ("request", "step", "drafted", "accepted")}


class Table(Importer):
    name = "table"
    description = "a CSV/TSV/Parquet/JSON Lines file of drafts or steps, with a column-mapping YAML (--mapping)"
    takes_mapping = True

    def read(self, path: Path, mapping: dict | None = None) -> Imported:
        rows, columns, workload = _check_mapping(mapping)
        f = table_file(path)
        absent = [c for c in [*columns.values(), *([workload] if workload else [])] if c not in f.columns]
        if absent:
            raise fail(str(path), f"no column {', '.join(absent)} (the mapping names it; the file has "
                                  f"{', '.join(f.columns)}).")
        f = f.with_row_index("_row")
        spec = TABLES[rows]
        out = {}
        for ours, theirs in columns.items():
            want = spec.columns[ours]
            col = f[theirs]
            if col.dtype.is_nested():  # a list or a record in a cell: no value of svt's column
                i = int(np.flatnonzero(col.is_not_null().to_numpy())[0]) if col.is_not_null().any() else 0
                v = col[i].to_list() if isinstance(col[i], pl.Series) else col[i]
                raise fail(row_where(path, f["_row"][i]), f"`{theirs}` (svt's `{ours}`) holds {col.dtype} values "
                                                          f"({v!r}): {_expected(ours, spec)}.")
            if col.dtype == pl.Boolean and want.is_integer():
                col = col.cast(pl.Int8)
            cast = col.cast(want, strict=False)
            bad = cast.is_null() if ours != "label" else cast.is_null() & col.is_not_null()  # empty, or not castable
            if want.is_integer() and col.dtype.is_float():  # 2.5 is not an integer: never truncated
                bad |= (col != col.floor()).fill_null(False) | (col.abs() > 2**62).fill_null(False)
            if want.is_integer() and col.dtype.is_integer():  # out of the column's range: never wrapped
                top = {pl.Int8: 127, pl.Int16: COUNT_MAX, pl.Int32: 2**31 - 1}.get(type(want))
                if top is not None:
                    bad |= (col > top).fill_null(False)
            if ours in spec.probabilities:
                bad |= cast.is_nan().fill_null(False) | (cast < 0).fill_null(False) | (cast > 1).fill_null(False)
            if ours == "label":
                bad |= ~cast.is_in([0, 1]).fill_null(True)
            if want.is_integer() and ours != "label":
                bad |= (cast < 0).fill_null(False)
            if bad.any():
                i = int(np.flatnonzero(bad.to_numpy())[0])
                raise fail(row_where(path, f["_row"][i]), f"`{theirs}` (svt's `{ours}`) is {col[i]!r}: "
                                                          f"{_expected(ours, spec)}.")
            if ours == "request" and not col.dtype.is_integer():  # "007" and "7": two ids of the file, one of svt's
                pairs = pl.DataFrame({"src": col.cast(pl.String), "id": cast}).unique()
                clash = pairs.filter(pl.col("id").is_duplicated()).sort("id", "src")
                if clash.height:
                    raise fail(str(path), f"`{theirs}` holds {clash['src'][0]!r} and {clash['src'][1]!r}, two requests "
                                          f"that are both request {clash['id'][0]} as a number: give each request "
                                          "one id.")
            out[ours] = cast
        if workload and f[workload].is_null().any():
            i = int(np.flatnonzero(f[workload].is_null().to_numpy())[0])
            raise fail(row_where(path, f["_row"][i]), f"`{workload}` (the workload column) is empty: every row "
                                                      "needs its workload.")
        frame = pl.DataFrame(out).with_columns(
            (f[workload].cast(pl.String) if workload else pl.lit(path.stem)).alias("workload"))
        split = frame.group_by("request").agg(pl.col("workload").n_unique().alias("n"), pl.col("workload").unique())
        split = split.filter(pl.col("n") > 1).sort("request")
        if split.height:
            r = split.row(0, named=True)
            raise fail(str(path), f"request {r['request']!r} is in {r['n']} workloads ({', '.join(map(str, r['workload']))}): "
                                  "a request belongs to one workload.")
        frame = frame.with_columns(pl.col("request").rank("dense").cast(pl.Int64).sub(1).alias("_req"))
        ids = frame.select("request", "_req").unique().sort("_req")
        names = ids["request"].to_list()
        frame = frame.with_columns(pl.col("_req").alias("request")).drop("_req")
        if rows == "drafts":
            drafts = frame
            steps = steps_from_drafts(drafts)
        else:
            over = frame.with_row_index("_i").filter(pl.col("accepted") > pl.col("drafted"))
            if over.height:
                raise fail(row_where(path, f["_row"][over["_i"][0]]), "more tokens accepted than drafted.")
            steps = frame.with_columns((pl.col("accepted") + 1).alias("emitted")) if "emitted" not in frame.columns \
                else frame
            drafts = chain_drafts(frame["request"].to_numpy(), frame["step"].to_numpy(), frame["drafted"].to_numpy(),
                                  frame["accepted"].to_numpy(), str(path)).join(
                frame.select("request", "workload").unique("request"), on="request", how="left", maintain_order="left")
        reqs = frame.select("request", "workload").unique("request").sort("request")
        return Imported(drafts, steps.drop("workload", strict=False), reqs,
                        lacks={"requests": ["prompt_ids", "output_ids", "finish_reason"]},
                        source={"rows": rows, "columns": columns, "workload": workload,
                                "requests": ids.height}, request_names=names)


def _expected(col: str, spec) -> str:
    if col == "label":
        return "expected 1 (accepted), 0 (rejected) or empty (never verified)"
    if col in spec.probabilities:
        return "expected a probability in [0, 1]"
    t = spec.columns[col]
    return "expected a non-negative integer" if t.is_integer() else f"expected a value of type {t}"


def _check_mapping(mapping: dict | None) -> tuple[str, dict[str, str], str | None]:
    if mapping is None:
        raise ConfigError("`svt import table` needs --mapping MAP.yaml (which svt column is which of the file's).")
    unknown = sorted(set(mapping) - {"rows", "columns", "workload"})
    if unknown:
        raise ConfigError(f"--mapping: unknown key(s) {', '.join(unknown)} (keys: rows, columns, workload).")
    rows = mapping.get("rows")
    if not isinstance(rows, str) or rows not in NEEDS:
        raise ConfigError(f"--mapping: `rows` must be drafts or steps, but got {rows!r}.")
    columns = mapping.get("columns")
    if not isinstance(columns, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in columns.items()):
        raise ConfigError("--mapping: `columns` must map svt column names to the file's column names.")
    allowed = [c for c in TABLES[rows].columns if c not in ("workload", "kept", "explored")]
    unknown = sorted(set(columns) - set(allowed))
    if unknown:
        raise ConfigError(f"--mapping: {', '.join(unknown)} is not a column of svt's {rows} table (its columns: "
                          f"{', '.join(allowed)}).")
    twice = sorted({v for v in columns.values() if list(columns.values()).count(v) > 1})
    if twice:
        raise ConfigError(f"--mapping: the file's column {twice[0]!r} is mapped to "
                          f"{' and '.join(k for k, v in columns.items() if v == twice[0])}; map each svt column "
                          "to its own file column.")
    missing = [c for c in NEEDS[rows] if c not in columns]
    if missing:
        raise ConfigError(f"--mapping: rows of {rows} need {', '.join(missing)} in `columns`.")
    workload = mapping.get("workload")
    if workload is not None and not isinstance(workload, str):
        raise ConfigError("--mapping: `workload` must name one of the file's columns.")
    return rows, columns, workload
