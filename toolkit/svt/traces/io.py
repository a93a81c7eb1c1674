"""Reading and writing run directories: atomic Parquet shards, run.json, lazy validating scans."""

from __future__ import annotations

import hashlib
import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from svt.errors import ConfigError, DataError, SchemaError, SvtError
from svt.fileio import atomic_path, json_text, parse_json, write_text_atomic
from svt.traces.derived import check_derived, row_checks
from svt.traces.schema import SCHEMA_VERSION, TABLES, TableSchema, get_table
from svt.traces.values import BAD_VALUE, common_checks, table_checks, tree_structure
from svt.traces.whole import check_counts

RUN_META = "run.json"
SHARD_RE = re.compile(r"part-(\d{5})\.parquet")


def shard_name(shard: int) -> str:
    return f"part-{shard:05d}.parquet"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _rows(path: Path) -> int:
    return int(pl.scan_parquet(path).select(pl.len()).collect().item())


def record_shards(meta: dict[str, Any], table: str, paths: list[Path]) -> None:
    """Record committed shards (row count and SHA-256) in the run's metadata, which the reader
    checks: a shard that goes missing, is duplicated or changes is an error, not a new number."""
    recs = meta.setdefault("shards", {}).setdefault(table, {})
    for p in paths:
        recs[p.name] = {"rows": _rows(p), "sha256": _sha256(p)}


def forget_shards(meta: dict[str, Any], table: str, names: set[str] | None = None) -> None:
    """Drop shard records of ``table`` (all, or ``names``)."""
    recs = (meta.get("shards") or {}).get(table)
    if recs is None:
        return
    for n in list(recs) if names is None else names:
        recs.pop(n, None)


def write_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    """Write run.json atomically (temporary name, then rename)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / RUN_META, json_text(meta, default=str), fsync=True)


def read_meta(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / RUN_META
    if not path.is_file():
        raise SchemaError(f"{path}: not found; expected a run directory made by `svt collect`.")
    try:
        meta = parse_json(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, ConfigError) as exc:
        raise SchemaError(f"{path}: not valid JSON ({exc}).") from None
    if not isinstance(meta, dict):
        raise SchemaError(f"{path}: expected a JSON object, but got {type(meta).__name__}.")
    version = meta.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SchemaError(
            f"{path}: expected `schema_version` {SCHEMA_VERSION}, but got {version!r}."
        )
    problem = meta_problem(meta)
    if problem:
        raise SchemaError(f"{path}: {problem}.")
    return meta


# run.json entries that are mappings when present (null: not recorded)
META_MAPPINGS = ("config", "sampling", "counts", "schedule", "shards", "models", "av", "hvd", "tree", "import",
                 "workloads", "workload_reading", "environment")


def _whole(v, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


def meta_problem(meta: dict) -> str | None:
    """run.json's entries of the wrong type (a hand edit, or damage), said before any is read: a
    count that is a string would otherwise switch its check off, a config that is a string would
    fail deep inside a report."""
    for key in META_MAPPINGS:
        if meta.get(key) is not None and not isinstance(meta[key], dict):
            return f"`{key}` is {meta[key]!r}: expected a mapping (a JSON object)"
    if meta.get("status") is not None and meta["status"] not in ("running", "complete"):
        return f"`status` is {meta['status']!r}: expected 'running' or 'complete'"
    sched = meta.get("schedule") or {}
    if sched.get("kind", "static") not in ("static", "continuous"):
        return f"`schedule.kind` is {sched['kind']!r}: expected 'static' or 'continuous'"
    cfg = meta.get("config") or {}
    for where, key, least in ((sched, "slots", 1), (cfg, "batch_size", 1), (cfg, "max_new_tokens", 1),
                              (meta, "k", 0), (meta, "batches", 0)):
        if where.get(key) is not None and not _whole(where[key], least):
            name = ("schedule." if where is sched else "config." if where is cfg else "") + key
            return f"`{name}` is {where[key]!r}: expected a whole number of at least {least}"
    for table, recs in (meta.get("shards") or {}).items():
        if not isinstance(recs, dict):
            return f"`shards.{table}` is {recs!r}: expected a mapping of shard name -> record"
        for name, rec in recs.items():
            if not isinstance(rec, dict):
                return f"`shards.{table}.{name}` is {rec!r}: expected a record (rows, sha256)"
            if rec.get("rows") is not None and not _whole(rec["rows"], 0):
                return f"`shards.{table}.{name}.rows` is {rec['rows']!r}: expected a whole number"
            if rec.get("sha256") is not None and not isinstance(rec["sha256"], str):
                return f"`shards.{table}.{name}.sha256` is {rec['sha256']!r}: expected a hex string"
    return None


def remove_partial(path: Path, tries: int = 50) -> None:
    """Remove a partly written folder after an interruption, repeating while a file being closed
    reappears in it (about 5 s at most). A Ctrl-C that polars turned into an exception stays pending
    and fires once more at the next Python call, so callers catch that one around this call:
    ``try: remove_partial(p) except KeyboardInterrupt: remove_partial(p)``."""
    import shutil
    import time

    for _ in range(tries):
        shutil.rmtree(path, ignore_errors=True)
        if not Path(path).exists():
            return
        time.sleep(0.1)


def write_shard(run_dir: Path, table: str, shard: int, frame: pl.DataFrame) -> Path:
    """Cast ``frame`` to the table's schema and write it as one shard, atomically."""
    spec = get_table(table)
    frame = frame.select([pl.col(c).cast(t) for c, t in spec.present(frame.columns).items()])
    folder = Path(run_dir) / table
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / shard_name(shard)
    with atomic_path(path, fsync=True) as tmp:
        frame.write_parquet(tmp, compression="zstd", statistics=True)
    return path


def list_shards(run_dir: Path, table: str) -> list[Path]:
    """The table's shards: files named ``part-NNNNN.parquet`` (temporary and hidden files aside)."""
    folder = Path(run_dir) / table
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if SHARD_RE.fullmatch(p.name))


def stray_files(run_dir: Path, table: str) -> list[Path]:
    """Files in a table's folder that are not shards (e.g. ``part-00001 (copy).parquet``)."""
    folder = Path(run_dir) / table
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".") and not SHARD_RE.fullmatch(p.name))


def shard_ids(run_dir: Path, table: str) -> set[int]:
    return {int(SHARD_RE.fullmatch(p.name).group(1)) for p in list_shards(run_dir, table)}


def _kind(dtype: pl.DataType) -> str:
    if dtype.is_integer():
        return "integer"
    if dtype.is_float():
        return "float"
    if isinstance(dtype, pl.List):
        return f"list[{_kind(dtype.inner)}]"
    return str(dtype)


def check_shard_schema(path: Path, spec: TableSchema) -> None:
    """Raise a SchemaError naming the file and column if the shard does not follow ``spec``."""
    try:
        found = pl.read_parquet_schema(path)
    except Exception as exc:  # polars raises ComputeError/OSError variants for damaged files
        raise SchemaError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc}).") from None
    for col, dtype in spec.columns.items():
        if col not in found:
            raise SchemaError(
                f"{path}: column `{col}` is missing; table `{spec.name}` needs "
                f"{', '.join(spec.columns)}."
            )
        if _kind(found[col]) != _kind(dtype):
            raise SchemaError(
                f"{path}: column `{col}` has type {found[col]}; expected {_kind(dtype)} ({dtype})."
            )
    for col, dtype in spec.optional.items():
        if col in found and _kind(found[col]) != _kind(dtype):
            raise SchemaError(f"{path}: column `{col}` has type {found[col]}; expected {_kind(dtype)} ({dtype}).")


def check_optional_alike(files: list[Path], spec: TableSchema) -> None:
    """Every shard of a table carries the same optional columns (a run's drafter logs its confidence
    in every batch or in none): one that differs is a shard of another run."""
    if not spec.optional or len(files) < 2:
        return
    first = {c for c in spec.optional if c in pl.read_parquet_schema(files[0])}
    for f in files[1:]:
        got = {c for c in spec.optional if c in pl.read_parquet_schema(f)}
        if got != first:
            one, other = (files[0], f) if first - got else (f, files[0])
            col = sorted(first ^ got)[0]
            raise SchemaError(f"{one}: carries the column `{col}`, which {other} does not: the shards of "
                              f"`{spec.name}` are not one run's.")


def check_shard_values(path: Path, spec: TableSchema, lacks: frozenset[str] = frozenset()) -> None:
    """Nulls where not allowed, NaN or out-of-range probabilities, labels outside {0, 1}, and each
    table's own bounds (``svt.traces.values``). ``lacks``: columns the run's source does not carry
    (an imported trace; run.json says which): all null."""
    lf = pl.scan_parquet(path)
    names = lf.collect_schema().names()
    checks = common_checks(spec, names, lacks) + table_checks(spec.name, names, lacks)
    derived = {f"derived:{col}": what for col, _, what in row_checks(spec.name)}
    checks += [expr.sum().alias(f"derived:{col}") for col, expr, _ in row_checks(spec.name)]
    row = lf.select(checks).collect().row(0, named=True)
    if spec.name in ("tree_drafts", "cache_trees") and not any(row.values()):
        row = tree_structure(lf, ("request", "step") if spec.name == "tree_drafts" else ("request", "decode_pos"))
    for key, n in row.items():
        if n:
            kind, col = key.split(":", 1)
            what = derived.get(key, "") if kind == "derived" else BAD_VALUE[kind]
            raise SchemaError(f"{path}: column `{col}` has {n} bad value(s): {what}.")


@dataclass
class Run:
    """An opened run directory: its metadata and lazy scans of its tables."""

    path: Path
    meta: dict[str, Any]
    shards: dict[str, list[Path]] = field(default_factory=dict)

    def has(self, table: str) -> bool:
        return bool(self.shards.get(table))

    def rows(self, table: str) -> int:
        """Rows of ``table`` over its shards: run.json's records where every shard has one (the
        reader checked them against the footers when it opened the run), else the Parquet footers;
        0 without shards."""
        files = self.shards.get(table, [])
        recs = ((self.meta.get("shards") or {}).get(table) or {}) if isinstance(self.meta.get("shards"), dict) else {}
        rows = [(recs.get(f.name) or {}).get("rows") for f in files]
        if files and all(isinstance(n, int) and not isinstance(n, bool) for n in rows):
            return sum(rows)
        return sum(_rows(f) for f in files)

    def lacks(self, table: str) -> list[str]:
        """Columns of ``table`` the run's source does not carry (null throughout): an imported
        trace's run.json names them (``import.lacks``); a collected run lacks none."""
        lacks = (self.meta.get("import") or {}).get("lacks") or {}
        cols = lacks.get(table) if isinstance(lacks, dict) else None
        if cols is not None and not (isinstance(cols, list) and all(c in get_table(table).columns for c in cols)):
            raise SchemaError(f"{self.path / RUN_META}: `import.lacks.{table}` is not a list of the table's columns.")
        return list(cols or [])

    @property
    def verified(self) -> bool:
        """Whether run.json records its shards (so missing, extra and changed shards are caught)."""
        return isinstance(self.meta.get("shards"), dict)

    @property
    def complete(self) -> bool:
        """False for a run whose collection was interrupted (``status: running``)."""
        return self.meta.get("status", "complete") == "complete"

    def require_complete(self) -> None:
        if not self.complete:
            raise DataError(f"{self.path}: the run is incomplete (status {self.meta.get('status')!r}: its "
                            "collection was interrupted); finish it with `svt collect CONFIG --out RUN --resume`.")

    @property
    def censored(self) -> bool:
        """Collected under live AV: trimmed drafts have no label."""
        return bool(self.meta.get("av"))

    def uncensored_drafts(self) -> pl.LazyFrame:
        """Drafts whose labels are not censored: all of them, or for a live-AV run only the
        steps that verified every draft (``explored``). Raises when a censored run has none."""
        drafts = self.scan("drafts")
        if not self.censored:
            return drafts
        explored = self.scan("steps").filter(pl.col("explored")).select("request", "step")
        if explored.select(pl.len()).collect().item() == 0:
            raise SchemaError(
                f"{self.path}: collected with live AV, so trimmed drafts have no label, and no step "
                "verified every draft; evaluating or fitting on it would treat censored labels as "
                "complete. Collect with `av.explore` > 0 (or without AV)."
            )
        return drafts.join(explored, on=["request", "step"], how="semi", maintain_order="left")

    def uncensored_parts(self) -> list[pl.LazyFrame]:
        """:meth:`uncensored_drafts` shard by shard (one lazy frame per drafts shard, in order)."""
        parts = self.parts("drafts")
        if not self.censored:
            return parts
        self.uncensored_drafts()  # the check that some step was explored
        explored = self.scan("steps").filter(pl.col("explored")).select("request", "step").collect().lazy()
        # the drafts' order kept: a shard is read several times (column by column) and its rows
        # must line up every time
        return [p.join(explored, on=["request", "step"], how="semi", maintain_order="left") for p in parts]

    def parts(self, table: str) -> list[pl.LazyFrame]:
        """Each shard of ``table`` as its own lazy frame cast to the schema's dtypes (for work done
        shard by shard, in bounded memory)."""
        files = self.shards.get(table) or []
        if not files:
            raise SchemaError(f"{self.path}: the run has no `{table}` table.")
        return [scan_shard(f, table) for f in files]

    def scan(self, table: str) -> pl.LazyFrame:
        """All shards of ``table`` as one lazy frame cast to the schema's dtypes."""
        spec = get_table(table)
        files = self.shards.get(table) or []
        if not files:
            raise SchemaError(f"{self.path}: the run has no `{table}` table.")
        lf = pl.scan_parquet([str(f) for f in files])
        return lf.with_columns([pl.col(c).cast(t) for c, t in spec.present(lf.collect_schema().names()).items()])

    def carries(self, table: str, column: str) -> bool:
        """Whether the run's ``table`` holds the optional ``column`` (its shards carry it alike)."""
        files = self.shards.get(table) or []
        return bool(files) and column in pl.read_parquet_schema(files[0])


def open_run(path: str | Path, *, deep: bool = True, tables: list[str] | None = None) -> Run:
    """Open and validate a run directory.

    Checks run.json, that the required tables exist, every shard's columns and types and, with
    ``deep=True``, the values (nulls, NaN, probability ranges, labels). Any problem raises one
    ``SchemaError`` naming the file, the column and what is wrong.
    """
    path = Path(path)
    if not path.is_dir():
        raise SchemaError(f"{path}: not a directory; expected a run directory made by `svt collect`.")
    meta = read_meta(path)
    run = Run(path=path, meta=meta)
    recorded = meta.get("shards")
    if recorded is not None and not isinstance(recorded, dict):
        raise SchemaError(f"{path / RUN_META}: `shards` must be a mapping of table -> shard records.")
    cfg_k = (meta.get("config") or {}).get("k") if isinstance(meta.get("config"), dict) else None
    if cfg_k is not None and meta.get("k") is not None and cfg_k != meta.get("k"):
        raise SchemaError(f"{path / RUN_META}: `k` is {meta.get('k')!r} but the run's config says {cfg_k!r}.")
    for name, spec in TABLES.items():
        if tables is not None and name not in tables:
            continue
        stray = stray_files(path, name)
        if stray:
            raise SchemaError(f"{stray[0]}: not a shard of this run (shards are named part-NNNNN.parquet); "
                              "move it out of the run directory.")
        files = list_shards(path, name)
        if spec.required and not files:
            if meta.get("status") == "running":
                raise SchemaError(f"{path}: the run's collection was interrupted before its first batch was written "
                                  "(status running, no shards yet); continue it with `svt collect CONFIG --out "
                                  f"{path} --resume`, or start again with --overwrite.")
            raise SchemaError(f"{path / name}: no shards; every run needs a `{name}` table.")
        for f in files:
            check_shard_schema(f, spec)
        check_optional_alike(files, spec)
        # an optional table removed whole (e.g. hidden states, to save space) is absent, not damaged
        recs = (recorded.get(name) or {}) if isinstance(recorded, dict) and (files or spec.required) else None
        if recs is not None:
            _check_records(path, name, files, recs)
        if deep:
            _check_deep(files, spec, frozenset(run.lacks(name)), recs or {})
        run.shards[name] = files
    check_counts(run)  # run.json's counts and batches against the tables, on every read
    if deep and "drafts" in run.shards:
        check_top_position(path, meta, run.scan("drafts").select(pl.col("position").max()).collect().item())
    if deep:
        check_derived(run)
    return run

    # (runs without shard records are read; `Run.verified` says whether their shards were checked)


def check_top_position(path: Path, meta: dict, top: int | None) -> None:
    """The drafts' last position (``top``) against run.json's K."""
    if top is None or not isinstance(meta.get("k"), int):
        return
    if top >= meta["k"]:
        raise SchemaError(f"{path}: drafts reach position {top}, but run.json says K = {meta['k']}.")
    # svt's collector drafts K tokens at every step (trimmed ones are logged unlabelled), except
    # under AV+length, whose rows may all stop short of K in every step of a run
    length = bool((meta.get("av") or {}).get("length"))
    if "config" in meta and not meta.get("hvd") and meta.get("engine", "svt") == "svt" and not length \
            and top != meta["k"] - 1:
        raise SchemaError(f"{path}: run.json says K = {meta['k']}, but the drafts stop at position {top}.")


def scan_shard(path: str | Path, table: str) -> pl.LazyFrame:
    """One shard of ``table`` as a lazy frame cast to the schema's dtypes (as :meth:`Run.parts`)."""
    lf = pl.scan_parquet(str(path))
    return lf.with_columns([pl.col(c).cast(t) for c, t in get_table(table).present(lf.collect_schema().names()).items()])


def _check_records(path: Path, table: str, files: list[Path], recs: dict) -> None:
    """The shards present must be exactly those run.json recorded, with their row counts."""
    present = {f.name for f in files}
    missing = sorted(set(recs) - present)
    extra = sorted(present - set(recs))
    if missing:
        raise SchemaError(f"{path / table}: {len(missing)} shard(s) recorded in run.json are missing "
                          f"({', '.join(missing[:3])}); the run is damaged.")
    if extra:
        raise SchemaError(f"{path / table}: {len(extra)} shard(s) are not recorded in run.json "
                          f"({', '.join(extra[:3])}): left by an interrupted collection (resume it) or copied in.")
    for f in files:
        rec = recs[f.name]
        n = _rows(f) if rec.get("rows") is not None else None
        if n is not None and n != rec["rows"]:
            raise SchemaError(f"{f}: {n} rows, but run.json recorded {rec['rows']}.")


def _check_deep(files: list[Path], spec: TableSchema, lacks: frozenset[str], recs: dict) -> None:
    """Every shard's values, and its SHA-256 against run.json's record. The hashes are computed on a
    second thread while the values are checked (hashlib and polars release the GIL); a shard whose
    content changed is reported as changed, even when its values are also wrong."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="svt-sha256")
    try:
        hashes = {f: pool.submit(_sha256, f) for f in files if (recs.get(f.name) or {}).get("sha256")}

        def check_hash(f: Path) -> None:
            if f in hashes and hashes[f].result() != recs[f.name]["sha256"]:
                raise SchemaError(f"{f}: its content differs from what run.json recorded (SHA-256); the shard "
                                  "was changed after it was written.")

        for f in files:
            try:
                check_shard_values(f, spec, lacks)
            except BaseException as exc:  # bad values, or bytes polars cannot decode (an error, or a
                # panic, which is no Exception): a changed shard says so
                if isinstance(exc, KeyboardInterrupt | SystemExit):
                    raise
                check_hash(f)
                raise
        for f in files:
            check_hash(f)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def check_shard_deep(path: str | Path, table: str, lacks: frozenset[str], sha256: str | None) -> None:
    """One shard's deep read (its values, and its SHA-256 against ``sha256``, run.json's record, when
    there is one), in :func:`open_run`'s words: for a cluster that reads a run shard by shard."""
    _check_deep([Path(path)], TABLES[table], frozenset(lacks), {Path(path).name: {"sha256": sha256}} if sha256 else {})


def check_distinct_runs(paths: list[str | Path]) -> None:
    """The same run given twice would be counted twice: refuse repeated paths and run ids."""
    seen: dict = {}
    for p in paths:
        key = Path(p).resolve()
        if key in seen:
            raise DataError(f"{p}: the same run is given twice; each run is counted once.")
        seen[key] = p
    ids: dict = {}
    for p in paths:
        if not (Path(p) / RUN_META).is_file():
            continue  # open_run says what is wrong with it
        try:
            rid = read_meta(Path(p)).get("run_id")
        except SchemaError:
            continue
        if rid is not None and rid in ids:
            raise DataError(f"{p} and {ids[rid]} are the same run (run_id {rid}): a copy would be counted twice.")
        ids[rid] = p


def open_runs(paths: list[str | Path], *, complete: bool = True, **kwargs) -> list[Run]:
    """Open several runs for fitting or evaluation: each once, each complete."""
    check_distinct_runs(paths)
    runs = [open_run(p, **kwargs) for p in paths]
    if complete:
        for r in runs:
            r.require_complete()
    return runs


def common_columns(runs, table: str = "drafts") -> list[str]:
    """The columns of ``table`` every opened run in ``runs`` holds: the required ones, then the
    optional ones all of them carry (several runs read as one frame)."""
    spec = get_table(table)
    return [*spec.columns, *[c for c in spec.optional if all(r.carries(table, c) for r in runs)]]


def carried_columns(paths, table: str = "drafts") -> set[str]:
    """The optional columns of ``table`` every run in ``paths`` carries (none where a run cannot be
    opened: the reader that opens it properly says why)."""
    spec = get_table(table)
    carried = set(spec.optional)
    for p in paths:
        try:
            run = open_run(p, deep=False, tables=[table])
        except (SvtError, OSError):
            return set()
        carried &= {c for c in spec.optional if run.carries(table, c)}
    return carried


def scan_runs(paths: list[str | Path], table: str = "drafts", *, deep: bool = True) -> pl.LazyFrame:
    """Several runs' ``table`` as one lazy frame with a leading ``run`` column (the directory name)."""
    frames = []
    check_distinct_runs(paths)
    spec = get_table(table)
    optional = set(spec.optional)
    for p in paths:
        run = open_run(p, deep=deep, tables=[table, "requests"] if table != "requests" else [table])
        optional &= {c for c in spec.optional if run.carries(table, c)}
        frames.append(run.scan(table).with_columns(pl.lit(Path(p).name).alias("run")))
    # an optional column stays where every run carries it (a confidence head's, when every run has one)
    keep = ["run", *spec.columns, *[c for c in spec.optional if c in optional]]
    return pl.concat([f.select(keep) for f in frames], how="vertical")
