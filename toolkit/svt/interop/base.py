"""What every importer shares: the contract, the imported tables, and the one writer.

An importer reads one foreign file into svt's tables (:class:`Imported`): the ``drafts`` (one
row per draft token with its label), the ``steps`` and the ``requests``. A format that does not
carry a column (draft probabilities, tokens, timings) leaves it null and names it in ``lacks``;
``run.json`` records it, the reader allows nulls there (and only there), and ``svt evaluate`` says
which studies the run cannot give. A format that carries only counts per step (drafted and
accepted) still gives exact labels: in a chain draft, positions before the accepted count were
accepted, the one at it was rejected, and later ones were never verified.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import polars as pl

from svt import __version__
from svt.errors import ConfigError, DataError
from svt.fileio import file_sha256, load_yaml_text
from svt.traces.io import open_run, write_meta
from svt.traces.rundir import RunSummary, commit_batch, finish_run, writing
from svt.traces.schema import SCHEMA_VERSION, TABLES

Q_COLUMNS = ("q_max", "q_sampled", "q_entropy", "q_margin")


def cannot_study(lacks: dict[str, list[str]]) -> list[str]:
    """What a run lacking these columns cannot give (said in run.json and in every report); its
    acceptance by position and acceptance length are exact whatever it lacks."""
    d, s = set(lacks.get("drafts", [])), set(lacks.get("steps", []))
    out = []
    if d >= set(Q_COLUMNS):
        out.append("acceptance features of the draft's distribution (q_max, entropy, margin): the file has no draft "
                   "probabilities; fit a predictor on what it carries, or study acceptance by position and length")
    elif d & set(Q_COLUMNS):
        out.append(f"the features that read {', '.join(c for c in Q_COLUMNS if c in d)}")
    if {"accept_prob", "accept_prob_expected"} <= d:
        out.append("soft labels (min(1, p/q) and 1 − TV(p, q)): hard labels only")
    if {"draft_ms", "verify_ms"} & s:
        out.append("measured step costs: simulate with a cost table (--costs)")
    out.append("the losslessness audit of trimming (no target and draft distributions, dists/)")
    return out


class ImportFormatError(DataError):
    """A file that is not in the format it was imported as (names the first offending record)."""


@dataclass
class Imported:
    """A foreign trace as svt's tables. ``lacks``: table -> columns the format does not carry
    (written as nulls; columns a frame leaves out are added to it); ``source``: what the file was
    (recorded in run.json under ``import``)."""

    drafts: pl.DataFrame
    steps: pl.DataFrame
    requests: pl.DataFrame
    lacks: dict[str, list[str]] = field(default_factory=dict)
    source: dict = field(default_factory=dict)
    greedy: bool | None = None  # None: the format does not say
    request_names: list | None = None  # each request's id in the file (for messages), by svt's index
    drafter: str = "model"  # who drafted: a model, or a suffix cache ("cache")
    svt_source: dict | None = None  # the svt run the file was exported from (see svt.interop.provenance)
    tree: dict | None = None  # tree speculation: run.json's ``tree`` (the steps hold tree sizes)


class Importer:
    """Base class: ``name`` (the FORMAT of ``svt import FORMAT``), ``description`` (the format,
    and where it is defined, in words) and :meth:`read`."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    takes_mapping: ClassVar[bool] = False  # reads a column-mapping YAML (--mapping)

    def read(self, path: Path, mapping: dict | None = None) -> Imported:  # pragma: no cover - interface
        raise NotImplementedError


def fail(where: str, what: str) -> ImportFormatError:
    """The one message for a file not in its format: where (file and record) and what is wrong."""
    return ImportFormatError(f"{where}: {what}")


def requests_frame(requests: list[dict]) -> tuple[pl.DataFrame, dict[str, str]]:
    """The requests table of records ``{request, workload, prompt_ids, output_ids}`` (ids or None),
    and a note per column given for some requests only: such a column is dropped (null for all,
    named in ``lacks``) rather than half filled."""
    notes = {}
    for col in ("prompt_ids", "output_ids"):
        given = sum(r[col] is not None for r in requests)
        if 0 < given < len(requests):
            notes[col] = f"given for {given} of {len(requests)} requests: not imported"
            for r in requests:
                r[col] = None
    return pl.DataFrame(requests, schema_overrides={"prompt_ids": pl.List(pl.Int32),
                                                    "output_ids": pl.List(pl.Int32)}), notes


COUNT_MAX = 2**15 - 1  # draft positions are 16-bit


def chain_drafts(request: np.ndarray, step: np.ndarray, drafted: np.ndarray, accepted: np.ndarray,
                 where: str = "") -> pl.DataFrame:
    """Draft rows of chain drafts given only counts per step: position p of a step is accepted
    when p < accepted, rejected when p == accepted < drafted, never verified after. A step of
    more than ``COUNT_MAX`` drafts is refused (before any row is made)."""
    n = drafted.astype(np.int64)
    if n.size and (n.max() > COUNT_MAX or n.min() < 0):
        i = int(np.flatnonzero((n > COUNT_MAX) | (n < 0))[0])
        raise fail(where, f"request {request[i]} step {step[i]}: {n[i]} drafts; svt stores 0 to {COUNT_MAX} per step.")
    rows = np.repeat(np.arange(n.size), n)
    pos = np.arange(rows.size) - np.repeat(np.cumsum(n) - n, n)
    acc = accepted.astype(np.int64)[rows]
    label = np.where(pos < acc, 1, np.where(pos == acc, 0, -1))
    return pl.DataFrame({"request": request[rows].astype(np.int64), "step": step[rows].astype(np.int32),
                         "position": pos.astype(np.int16),
                         "label": pl.Series(label, dtype=pl.Int8).replace(-1, None)})


def steps_from_drafts(drafts: pl.DataFrame) -> pl.DataFrame:
    """The steps table of draft rows: drafted, accepted (the accepted prefix) and emitted (accepted
    plus the target's token) per request and step; no timings."""
    return (drafts.group_by("request", "step", maintain_order=True)
            .agg(pl.len().alias("drafted"), (pl.col("label") == 1).sum().alias("accepted"))
            .with_columns((pl.col("accepted") + 1).alias("emitted")))


def full_tables(imported: Imported) -> Imported:
    """Every schema column present: a column the format lacks is null (and named in ``lacks``);
    a steps table gets ``kept`` = drafted, ``explored`` true and ``batch_size`` 1 (no live AV, one
    request at a time as far as the format says)."""
    lacks = {t: list(c) for t, c in imported.lacks.items()}
    steps = imported.steps
    defaults = {"kept": pl.col("drafted"), "explored": pl.lit(True), "batch_size": pl.lit(1)}
    steps = steps.with_columns(**{c: e for c, e in defaults.items() if c not in steps.columns})
    out = {}
    for table, frame in (("drafts", imported.drafts), ("steps", steps), ("requests", imported.requests)):
        spec = TABLES[table]
        missing = [c for c in spec.columns if c not in frame.columns]
        empty = [c for c in spec.columns if c in frame.columns and c not in spec.nullable
                 and frame.height and frame[c].null_count() == frame.height]
        for c in [*missing, *empty]:
            if c not in lacks.get(table, []):
                lacks.setdefault(table, []).append(c)
        frame = frame.with_columns([pl.lit(None, dtype=spec.columns[c]).alias(c) for c in missing])
        out[table] = frame.select([pl.col(c).cast(t) for c, t in spec.present(frame.columns).items()])
    return Imported(out["drafts"], out["steps"], out["requests"], {t: c for t, c in lacks.items() if c},
                    imported.source, imported.greedy, imported.request_names, imported.drafter, imported.svt_source,
                    imported.tree)


def check_tables(imported: Imported, where: str) -> None:
    """What the reader would refuse, said now about the file: labels outside {0, 1}, positions that
    are not 0, 1, ... within a step, and labels that are not a chain's (accepted ones, then at most
    one rejection, then never verified)."""
    d = imported.drafts
    if imported.tree is not None and d.height == 0:  # tree speculation: counts per step, no draft rows
        if imported.steps["drafted"].sum() == 0:
            raise fail(where, "no tree drafted a node: nothing to study.")
    elif d.height == 0:
        raise fail(where, "no drafts (every step drafted nothing): nothing to study.")
    if d.height and d["label"].null_count() == d.height:
        raise fail(where, "no draft was verified (every label empty): nothing to study.")
    step = ["request", "step"]
    if "batch_size" in imported.steps.columns:
        few = imported.steps.filter(pl.col("batch_size") < 1).sort(step)
        if few.height:
            r = few.row(0, named=True)
            raise fail(where, f"request {_name(imported, r['request'])} step {r['step']} has batch_size "
                              f"{r['batch_size']}: a step decodes at least its own row.")
    twice = imported.steps.filter(pl.struct(step).is_duplicated()).sort(step)
    if twice.height:
        r = twice.row(0, named=True)
        raise fail(where, f"request {_name(imported, r['request'])} has step {r['step']} more than once.")
    bad = d.with_columns(
        pl.int_range(pl.len()).over(step, order_by="position").alias("_i"),
        pl.col("label").is_not_null().sum().over(step).alias("_v"),
        (pl.col("label") == 1).sum().over(step).alias("_a"),
    ).with_columns(
        pl.when(~pl.col("label").is_in([0, 1]) & pl.col("label").is_not_null()).then(pl.lit("a label other than 0, 1 or null"))
        .when(pl.col("position") != pl.col("_i")).then(pl.lit("positions that are not 0, 1, ... in order"))
        .when((pl.col("label").is_not_null() != (pl.col("position") < pl.col("_v")))
              | ((pl.col("label") == 1).fill_null(False) != (pl.col("position") < pl.col("_a")))
              | (pl.col("_v") - pl.col("_a") > 1))
        .then(pl.lit("labels that are not a chain's (accepted drafts, then at most one rejection, then never "
                     "verified)"))
        .alias("_why")
    ).filter(pl.col("_why").is_not_null()).sort(step)
    if bad.height:
        r = bad.row(0, named=True)
        raise fail(where, f"request {_name(imported, r['request'])} step {r['step']} has {r['_why']}.")
    _check_timings_and_probabilities(imported, where)
    _check_within_rows(imported, where)


def _check_within_rows(imported: Imported, where: str) -> None:
    """The reader's within-row checks (:func:`svt.traces.derived.row_checks`: an entropy below
    -ln q_max, say a normalised entropy mapped to ``q_entropy``; a margin above ``q_max``; a step
    emitting more than its accepted drafts + 1), said now with the source's request and step,
    instead of at every later read of the written run."""
    from svt.traces.derived import row_checks

    for table, frame in (("drafts", imported.drafts), ("steps", imported.steps)):
        checks = [("q_entropy", pl.col("q_entropy").is_nan() | (pl.col("q_entropy") < 0), "NaN or negative")] \
            if table == "drafts" else []
        for col, bad, what in [*checks, *row_checks(table)]:
            if not set(bad.meta.root_names()) <= set(frame.columns):
                continue
            x = frame.filter(bad.fill_null(False))
            if x.height:
                r = x.row(0, named=True)
                at = f" position {r['position']}" if "position" in r else ""
                v = f"{r[col]:.6g}" if isinstance(r[col], float) else repr(r[col])
                raise fail(where, f"request {_name(imported, r['request'])} step {r['step']}{at} has `{col}` {v}: "
                                  f"{what}.")


MAX_STEP_MS = 1e7  # ~3 hours for one draft or verify pass: beyond it a time is a unit or parse error


def _check_timings_and_probabilities(imported: Imported, where: str) -> None:
    """Step times that are negative, infinite or absurd (a unit slip, 1e308), and an accepted
    draft whose recorded acceptance probability is 0 (the test accepts with that probability)."""
    steps = imported.steps
    for col in ("draft_ms", "verify_ms"):
        if col not in steps.columns:
            continue
        x = steps.with_row_index("_i").filter(pl.col(col).is_not_null() & (~pl.col(col).is_finite() | (pl.col(col) < 0)
                                                                         | (pl.col(col) > MAX_STEP_MS)))
        if x.height:
            r = x.row(0, named=True)
            raise fail(where, f"request {_name(imported, r['request'])} step {r['step']} has {col} {r[col]!r}: "
                              f"expected a time in milliseconds, 0 to {MAX_STEP_MS:.0e}.")
    d = imported.drafts
    if "accept_prob" in d.columns:
        x = d.filter((pl.col("label") == 1) & (pl.col("accept_prob") == 0))
        if x.height:
            r = x.row(0, named=True)
            raise fail(where, f"request {_name(imported, r['request'])} step {r['step']} position {r['position']} "
                              "was accepted with an acceptance probability of 0: the labels and probabilities "
                              "disagree.")


def _name(imported: Imported, request: int) -> str:
    """A request as the file names it (its id there), else svt's index."""
    names = imported.request_names
    return repr(names[request]) if names is not None and 0 <= request < len(names) else str(request)


def write_imported(imported: Imported, out: Path, *, source_path: Path, fmt: str, overwrite: bool = False,
                   inputs: dict[str, Path] | None = None) -> RunSummary:
    """Write the run directory (beside ``out``, swapped in when complete: nothing is written on
    an error) with ``run.json`` saying where the data came from and what it lacks. ``out`` is
    checked (``overwrite``, overlap with ``inputs``) while its lock is held."""
    import time

    t0 = time.time()
    imported = full_tables(imported)
    src = imported.svt_source
    if src is not None and len(src["requests"]) != imported.requests.height:  # one source id per request
        raise DataError(f"{source_path}: {len(src['requests'])} records name their svt source request, but "
                        f"{imported.requests.height} requests were read.")
    k = int(imported.drafts["position"].max()) + 1 if imported.drafts.height else 0
    workloads = sorted(set(imported.requests["workload"].drop_nulls().to_list()))
    lacks = imported.lacks
    meta = {
        "run_id": uuid.uuid4().hex[:12], "svt_version": __version__, "schema_version": SCHEMA_VERSION,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "status": "running",
        "engine": "import", "k": k,
        "import": {"format": fmt, "source": str(Path(source_path).resolve()), "source_sha256": file_sha256(source_path),
                   **imported.source, "lacks": lacks, "cannot_study": cannot_study(lacks),
                   **({"svt_source": imported.svt_source} if imported.svt_source else {})},
        "sampling": {"greedy": imported.greedy, "features_from": "the imported file"},
        "drafter_kinds": [imported.drafter], "av": None, "workloads": {w: str(source_path) for w in workloads},
        "seed": None, "batches": 1,
    }
    with writing(out, overwrite=overwrite, inputs=inputs) as run_dir:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_meta(run_dir, meta)
        commit_batch(run_dir, meta, 0, {"drafts": imported.drafts, "steps": imported.steps,
                                        "requests": imported.requests})
        summary = finish_run(run_dir, meta, time.time() - t0, resumed=0)
        if imported.tree is not None:
            st = imported.steps.select(pl.len(), pl.col("drafted").cast(pl.Int64).sum(),
                                       pl.col("accepted").cast(pl.Int64).sum()).row(0)
            meta["tree"] = {**imported.tree, "steps": st[0], "tree_nodes": st[1], "accepted": st[2],
                            "accepted_per_step": st[2] / max(st[0], 1), "accepted_per_node": st[2] / max(st[1], 1)}
            write_meta(run_dir, meta)
        open_run(run_dir)  # read back as every later stage will (deep): a failure leaves --out as it was
    summary.run_dir = out
    return summary


def read_mapping(path: Path | None) -> dict | None:
    """A column-mapping YAML (``svt import table FILE --mapping MAP.yaml``)."""
    if path is None:
        return None
    import yaml

    if not Path(path).is_file():
        raise ConfigError(f"--mapping {path}: not found.")
    try:
        data = load_yaml_text(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"--mapping {path}: not UTF-8 text.") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"--mapping {path}: not valid YAML ({exc}).") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--mapping {path}: expected a mapping of svt columns to file columns.")
    return data
