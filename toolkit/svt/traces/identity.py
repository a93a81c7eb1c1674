"""What makes two runs the same experiment, and two draws of it the same data: one definition, read
by `svt compare` (which reports may be compared, and whether their differences can be sampling
noise) and by fitted predictors (which requests a fit was trained on).

*Experiment* (:func:`experiment`): what is measured — the models' weights, K, sampling, the
workloads' contents, request and token limits, cache options (and the batch size when a cache is
on: the global suffix tree grows as a batch's requests finish), the engine (svt, vLLM, live AV,
live HVD, reference text, synthetic) and the shard a run covers. Not the seed or the device: they
change the draw, not what is measured.

*Data identity* (:func:`data_identity`): the drafts a report scored, in two parts.

- ``structure_sha256``: the requests, steps, positions, draft tokens and labels, exactly. Two runs
  with equal structures made the same decisions everywhere.
- ``score_sketch``: eight random ±1 projections of each draft-probability column (signs drawn from
  each row's structure hash). For two draws with the same structure, the squared difference of a
  projection has expectation sum_i d_i² over the per-row differences d_i, so
  sqrt(mean_j ΔS_j² / n) estimates the RMS per-draft difference of that column without the rows.

Two draws are *the same data* (:func:`same_data`) when their structures are equal and every
probability column differs by an RMS of at most :data:`SCORE_TOLERANCE`: the same experiment run on
another machine, whose floating-point sums differ around the 7th digit. Then a difference in a
metric comes from the code, not from sampling, and `svt compare` judges it by tolerances instead
of bootstrap intervals.
"""

from __future__ import annotations

import functools
import hashlib
import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl

# an RMS per-draft difference of the draft probabilities up to this is float noise (another
# machine's BLAS: ~1e-7); a different draw or a changed collection differs by 1e-2 and more
SCORE_TOLERANCE = 1e-4
STRUCTURE_COLUMNS = ("request", "step", "position", "token", "label")
SCORE_COLUMNS = ("q_max", "q_sampled", "q_entropy")
# the columns each table's identity hashes (structure, scores): a yield fit reads cache drafts, whose
# decode positions, lengths and both sources' yields are what it learned from
IDENTITY_COLUMNS = {
    "drafts": (STRUCTURE_COLUMNS, SCORE_COLUMNS),
    "cache_drafts": (("request", "decode_pos", "draft_len", "match_len", "oracle_accepted", "model_accepted"),
                     ("score",)),
    "tree_drafts": (("request", "step", "node", "parent", "token", "label"), ("q_token", "q_max", "q_entropy")),
    "cache_trees": (("request", "decode_pos", "node", "parent", "token", "label"), ("prob", "score")),
}
N_PROJECTIONS = 8
_CHUNK = 1 << 20
_MASK = (1 << 64) - 1


def _mix64(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser (uint64 arithmetic wraps)."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def _row_hashes(chunk: pl.DataFrame, cols: list[str], h: np.ndarray | None = None, first: int = 0) -> np.ndarray:
    """One uint64 per row over ``cols``, from the raw bit patterns (stable across polars versions);
    ``h`` and ``first``: continue the hash of earlier columns (``first`` of them)."""
    h = np.full(chunk.height, 0x9E3779B97F4A7C15, dtype=np.uint64) if h is None else h.copy()
    for i, c in enumerate(cols, start=first):
        col = chunk[c]
        v = col.fill_null(0).to_numpy()
        bits = v.view(f"u{v.dtype.itemsize}").astype(np.uint64)
        bits[col.is_null().to_numpy()] = np.uint64(0xFFFFFFFFFFFFFFFF)  # null: a value no column has
        h = _mix64(h ^ _mix64(bits + np.uint64(((i + 1) * 0x9E3779B97F4A7C15) & _MASK)))
    return h


class _OrderFreeHash:
    """Row hashes summed modulo 2**64 twice (two mixes): independent of row order and sharding."""

    def __init__(self):
        self.acc, self.rows = [0, 0], 0

    def add(self, h: np.ndarray) -> None:
        self.acc[0] = (self.acc[0] + int(h.sum(dtype=np.uint64))) & _MASK
        self.acc[1] = (self.acc[1] + int(_mix64(h ^ np.uint64(0xD6E8FEB86659FD93)).sum(dtype=np.uint64))) & _MASK
        self.rows += len(h)

    def hexdigest(self, cols: list[str]) -> str:
        return hashlib.sha256(f"{cols}|{self.rows}|{self.acc[0]}|{self.acc[1]}".encode()).hexdigest()[:16]


def _frames(parts) -> list:
    return [parts] if isinstance(parts, pl.DataFrame | pl.LazyFrame) else list(parts)


def _names(part) -> list[str]:
    return part.collect_schema().names() if isinstance(part, pl.LazyFrame) else part.columns


def data_identity(parts, *, compiled: bool = True, table: str = "drafts") -> dict:
    """The data identity of a drafts table (frames, lazy or not, read one at a time):
    ``sha256`` (every fingerprinted column, exactly), ``structure_sha256``, ``rows`` and
    ``score_sketch`` (see the module docstring). ``compiled``: hash through the compiled loop
    (`svt.traces.identity_kernel`); ``False`` runs the numpy definition (the reference: the same
    hashes, sketches equal up to float rounding). ``table``: which table's columns are hashed
    (:data:`IDENTITY_COLUMNS`)."""
    acc = Identity(table)
    for part in _frames(parts):
        acc.add(part, compiled=compiled)
    return acc.result()


class Identity:
    """The data identity accumulated frame by frame (frames of one table, in any order)."""

    def __init__(self, table: str = "drafts"):
        self.table = table
        self.exact, self.structure = _OrderFreeHash(), _OrderFreeHash()
        self.sketch: dict[str, np.ndarray] = {}
        self.s_cols = self.p_cols = None

    @property
    def columns(self) -> list[str]:
        return (self.s_cols or []) + (self.p_cols or [])

    def columns_of(self, names: list[str]) -> list[str]:
        """The columns hashed, from a frame's column names (fixed by the first frame)."""
        if self.s_cols is None:
            structure, scores = IDENTITY_COLUMNS[self.table]
            self.s_cols = [c for c in structure if c in names]
            self.p_cols = [c for c in scores if c in names]
            self.sketch = {c: np.zeros(N_PROJECTIONS) for c in self.p_cols}
        return self.columns

    def add(self, part, *, compiled: bool = True) -> None:
        frame = part.select(self.columns_of(_names(part)))
        frame = frame.collect() if isinstance(frame, pl.LazyFrame) else frame
        if compiled and self._native(frame):
            self._add_native(frame)
            return
        for a in range(0, frame.height, _CHUNK):
            chunk = frame.slice(a, _CHUNK)
            (self._add_compiled if compiled else self._add_numpy)(chunk)

    def _add_numpy(self, chunk: pl.DataFrame) -> None:
        s_cols, p_cols = self.s_cols, self.p_cols
        hs = _row_hashes(chunk, s_cols)
        self.structure.add(hs)
        self.exact.add(_row_hashes(chunk, p_cols, hs, len(s_cols)))  # the same as hashing every column
        if p_cols:  # one ±1 matrix [rows, 8] from the structure hash, times the columns [rows, 3]
            bits = _mix64(hs ^ np.uint64(0x5DEECE66D))[:, None] >> np.arange(N_PROJECTIONS, dtype=np.uint64)
            signs = (bits & np.uint64(1)).astype(np.float64) * 2.0 - 1.0
            proj = signs.T @ _scores(chunk, p_cols).T
            for i, c in enumerate(p_cols):
                self.sketch[c] += proj[:, i]

    def _add_compiled(self, chunk: pl.DataFrame) -> None:
        from svt.traces.identity_kernel import identity_chunk

        s_cols, p_cols = self.s_cols, self.p_cols
        sbits = np.empty((len(s_cols), chunk.height), dtype=np.uint64)
        pbits = np.empty((len(p_cols), chunk.height), dtype=np.uint64)
        for i, c in enumerate(s_cols):
            _bits(chunk[c], sbits[i])
        for i, c in enumerate(p_cols):
            _bits(chunk[c], pbits[i])
        consts = np.array([((i + 1) * 0x9E3779B97F4A7C15) & _MASK for i in range(len(s_cols) + len(p_cols))],
                          dtype=np.uint64)
        x = _scores(chunk, p_cols)
        self._in_halves(chunk.height, lambda acc, sketch, lo, hi: identity_chunk(
            sbits, pbits, consts, x, N_PROJECTIONS, acc, sketch, lo, hi))

    def _native(self, frame: pl.DataFrame) -> bool:
        """Whether the compiled loop can read the columns where they are: all five structure columns,
        integers, and float score columns (else each column is copied into uint64 bit patterns)."""
        return (self.table == "drafts" and self.s_cols == list(STRUCTURE_COLUMNS) and all(frame.schema[c].is_integer() for c in self.s_cols)
                and all(frame.schema[c].is_float() for c in self.p_cols))

    def _add_native(self, frame: pl.DataFrame) -> None:
        from svt.traces.identity_kernel import identity_columns

        s = [_values(frame[c]) for c in self.s_cols]
        p = [_values(frame[c]) for c in self.p_cols]
        p += [_values(pl.Series([], dtype=pl.Float32))] * (3 - len(p))
        consts = np.array([((i + 1) * 0x9E3779B97F4A7C15) & _MASK for i in range(8)], dtype=np.uint64)
        bits, null, x = tuple(v[1] for v in s), tuple(v[2] for v in s), tuple(v[0] for v in p)
        p_bits, p_null = tuple(v[1] for v in p), tuple(v[2] for v in p)
        self._in_halves(frame.height, lambda acc, sketch, lo, hi: identity_columns(
            bits, null, p_bits, p_null, x, len(self.p_cols), consts, N_PROJECTIONS, acc, sketch, lo, hi))

    def _in_halves(self, rows: int, run) -> None:
        """Run the compiled loop ``run(acc, sketch, lo, hi)`` on two threads, one half of the rows each
        (the loop releases the GIL; the sums are order-free), and add both into the identity."""
        p_cols = self.p_cols
        halves = [(0, rows // 2), (rows // 2, rows)]
        accs = [np.zeros(4, dtype=np.uint64) for _ in halves]
        sketches = [np.zeros((len(p_cols), N_PROJECTIONS)) for _ in halves]
        list(_pool().map(lambda i: run(accs[i], sketches[i], *halves[i]), range(2)))
        acc = [sum(int(a[j]) for a in accs) & _MASK for j in range(4)]
        sketch = sketches[0] + sketches[1]
        for h, (a, b) in ((self.structure, acc[:2]), (self.exact, acc[2:])):
            h.acc[0] = (h.acc[0] + int(a)) & _MASK
            h.acc[1] = (h.acc[1] + int(b)) & _MASK
            h.rows += rows
        for i, c in enumerate(p_cols):
            self.sketch[c] += sketch[i]

    def merge(self, other: Identity) -> Identity:
        """This identity and ``other``'s (another shard's, computed elsewhere) as one: the order-free
        hashes add modulo 2**64, the sketches add (equal to one pass up to float rounding)."""
        if other.s_cols is None:
            return self
        if self.s_cols is None:
            self.s_cols, self.p_cols, self.sketch = list(other.s_cols), list(other.p_cols), {
                c: np.zeros(N_PROJECTIONS) for c in other.p_cols}
        if (self.s_cols, self.p_cols) != (other.s_cols, other.p_cols):
            raise ValueError(f"shards with other fingerprinted columns ({self.columns} against {other.columns})")
        for mine, theirs in ((self.exact, other.exact), (self.structure, other.structure)):
            mine.acc = [(a + b) & _MASK for a, b in zip(mine.acc, theirs.acc, strict=True)]
            mine.rows += theirs.rows
        for c in self.p_cols:
            self.sketch[c] = self.sketch[c] + other.sketch[c]
        return self

    def result(self) -> dict:
        return {"sha256": self.exact.hexdigest(self.columns),
                "structure_sha256": self.structure.hexdigest(self.s_cols or []),
                "rows": self.exact.rows, "score_sketch": {c: [float(v) for v in s] for c, s in self.sketch.items()}}


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="svt-identity")


def _bits(col: pl.Series, out: np.ndarray) -> None:
    """A column's raw bit patterns as uint64 into ``out`` (a null: a value no column has)."""
    v = col.fill_null(0).to_numpy()
    out[:] = v.view(f"u{v.dtype.itemsize}")
    if col.null_count():
        out[col.is_null().to_numpy()] = np.uint64(0xFFFFFFFFFFFFFFFF)


def _values(col: pl.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A column's values (a null as 0; a view when it has none), the same memory as unsigned integers
    of its width (its bit patterns) and its null mask (empty when none)."""
    nulls = col.null_count()
    v = (col.fill_null(0) if nulls else col).to_numpy()
    null = col.is_null().to_numpy() if nulls else np.zeros(0, np.bool_)
    for a in (v, null):  # read-only, whether polars lent its memory or copied: one compiled signature
        a.setflags(write=False)
    return v, v.view(f"u{v.dtype.itemsize}"), null


def _scores(chunk: pl.DataFrame, p_cols: list[str]) -> np.ndarray:
    """The score columns as float64 [columns, rows] (null and NaN as 0)."""
    if not p_cols:
        return np.zeros((0, chunk.height))
    return np.ascontiguousarray(chunk.select(pl.col(c).cast(pl.Float64).fill_null(0.0).fill_nan(0.0)
                                             for c in p_cols).to_numpy().T)


def data_fingerprint(parts) -> str:
    """The exact fingerprint (16 hex digits) of the drafts: ids, tokens, labels and the draft's
    probabilities. Row order and sharding do not change it."""
    return data_identity(parts)["sha256"]


def _real(x) -> bool:
    """A finite float of a size a sum of probabilities can have (no NaN, no 1e308)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and abs(x) < 1e200


def score_difference(a: dict, b: dict) -> float | None:
    """The estimated RMS per-draft difference of the worst probability column between two draws of
    equal structure (None when a sketch is missing or the columns differ)."""
    sa, sb = a.get("score_sketch"), b.get("score_sketch")
    n = a.get("rows")
    if (not isinstance(sa, dict) or not isinstance(sb, dict) or set(sa) != set(sb) or not isinstance(n, int)
            or isinstance(n, bool) or n < 0):
        return None
    worst = 0.0
    for c in sa:
        va, vb = sa[c], sb[c]
        if not (isinstance(va, list) and isinstance(vb, list) and len(va) == len(vb) == N_PROJECTIONS):
            return None
        if not all(_real(x) for x in [*va, *vb]):  # a damaged sketch is never a match (NaN compares as 0)
            return None
        msd = sum((x - y) ** 2 for x, y in zip(va, vb, strict=True)) / N_PROJECTIONS
        if not math.isfinite(msd):
            return None
        worst = max(worst, math.sqrt(msd / max(n, 1)))
    return worst


def same_data(a: dict | None, b: dict | None, tolerance: float = SCORE_TOLERANCE) -> tuple[bool, str]:
    """Whether two data identities are the same data, and why (one sentence)."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False, "a report has no data identity (written by an older svt): treated as different draws"
    if a.get("sha256") is not None and a.get("sha256") == b.get("sha256"):
        return True, "identical drafts (equal data fingerprints)"
    if a.get("structure_sha256") != b.get("structure_sha256") or a.get("rows") != b.get("rows"):
        return False, ("different draws: the requests, steps, draft tokens or labels differ "
                       f"({a.get('rows')} against {b.get('rows')} drafts)")
    rms = score_difference(a, b)
    if rms is None:
        return False, "the same tokens and labels, but the probability sketches cannot be compared: treated as different draws"
    if rms <= tolerance:
        return True, (f"the same requests, steps, draft tokens and labels; the draft probabilities differ by "
                      f"an RMS of {rms:.1e} per draft, within the float tolerance {tolerance:g} (another "
                      "machine's arithmetic)")
    return False, (f"the same tokens and labels, but the draft probabilities differ by an RMS of {rms:.2g} per "
                   f"draft (over the float tolerance {tolerance:g}): treated as different draws")


def identity_table(run, prefer: str | None = None) -> str:
    """The table a run's data identity is taken over: ``prefer`` (the table a fit read) where the run
    has rows in it, else its drafts where it has any, else its cache drafts. By rows, not by shards:
    a reference or stand-in run writes an empty drafts shard, and an identity of no rows is the
    identity of every such run."""
    for table in (prefer, "drafts", "tree_drafts", "cache_drafts"):
        if table in IDENTITY_COLUMNS and run.has(table) and run.rows(table) > 0:
            return table
    return prefer if prefer in IDENTITY_COLUMNS else "drafts"


def run_identity(run, table: str | None = None) -> dict:
    """The data identity of an opened run (:class:`svt.traces.io.Run`) over
    :func:`identity_table`'s table (``table``: the one a fit read, where the run has rows in it)."""
    table = identity_table(run, table)
    return {"table": table, **data_identity(run.parts(table) if run.has(table) else [], table=table)}


def run_record(path, run) -> dict:
    """What a fit records of a run it was trained on: where, its id, K and the model pair (offline
    fits add the run's data identity, so an identical re-collection under a new run id is still
    recognised as seen; online fits score every draft and skip that pass over the data)."""
    return {"path": str(path), "run_id": run.meta.get("run_id"), "k": run.meta.get("k"),
            "pair": model_pair(run.meta)}


def model_pair(meta: dict) -> dict:
    """The target and draft weights a run was collected with (a fit applies to its own pair)."""
    models = meta.get("models") or {}
    return {role: (models.get(role) or {}).get("weights_sha256_16") for role in ("target", "draft")}


def _engine(meta: dict) -> str:
    if meta.get("synthetic"):
        return "synthetic"
    engine = meta.get("engine") or "svt"
    if engine == "svt" and meta.get("hvd"):
        return "svt live HVD"
    if engine == "svt" and meta.get("av"):
        return "svt live AV"
    return str(engine)


def experiment(meta: dict) -> dict:
    """What defines a run as an experiment (two runs with equal experiments are draws of the same
    thing and may be compared; see the module docstring)."""
    cfg = meta.get("config") or {}
    sampling = meta.get("sampling") or {}
    cache = meta.get("cache") if isinstance(meta.get("cache"), dict) else None
    shard = meta.get("shard") if isinstance(meta.get("shard"), dict) else None
    synthetic = meta.get("synthetic") if isinstance(meta.get("synthetic"), dict) else None
    pair = model_pair(meta)
    reading = meta.get("workload_reading") if isinstance(meta.get("workload_reading"), dict) else {}
    turns = reading.get("turns") if isinstance(reading.get("turns"), dict) else {}
    # how chat records were read and whether rows repeat change the requests (recorded only when not
    # the defaults, so runs from before they existed keep their identity)
    extra = {**({"turns": turns} if any(t != "last" for t in turns.values()) else {}),
             **({"repeat": True} if reading.get("repeat") else {})}
    return {**extra, "target_weights": pair["target"], "draft_weights": pair["draft"],
            "k": meta.get("k"), "temperature": sampling.get("temperature", cfg.get("temperature")),
            "top_p": sampling.get("top_p", cfg.get("top_p")),
            "workloads": meta.get("workload_sha256") or cfg.get("workloads"),
            "requests": cfg.get("requests"), "max_new_tokens": cfg.get("max_new_tokens"),
            "max_prompt_tokens": cfg.get("max_prompt_tokens"),
            "engine": _engine(meta),
            "cache_options": (cache or {}).get("options") if cache else None,
            # the global tree takes a response when its request finishes: batches change its content
            "batch_size": cfg.get("batch_size") if cache else None,
            "shard": f"{shard.get('index')}/{shard.get('count')}" if shard else "whole",
            "synthetic": ({"source_run_id": synthetic.get("source_run_id"),
                           "labelled_target": synthetic.get("labelled_target")} if synthetic else None)}


# --- which requests are the same request, when the run ids say nothing --------------------------

# A request's acceptance sequence (per verification step: drafts verified, drafts accepted) over at
# least this many steps identifies it: two different requests agree on it only by coincidence
# (with K = 4 each step has up to 9 outcomes), so a run whose long requests repeat a fit's training
# requests is that fit's training data, re-imported or re-exported, whatever its run id.
MIN_SIGNATURE_STEPS = 16
MIN_VARIED_STEPS = 4


def request_signatures(drafts: pl.DataFrame | pl.LazyFrame, min_steps: int = MIN_SIGNATURE_STEPS) -> pl.DataFrame:
    """One row per request that its acceptance sequence identifies: ``_run`` (when the frame has
    it), ``request`` and ``signature`` (16 hex digits of the sequence of (drafts verified, drafts
    accepted) per step, in step order; step numbers and probabilities do not enter, so an import
    that renumbers steps or drops the draft tokens has the same signature). A request counts when
    it has at least ``min_steps`` verified steps of which at least ``MIN_VARIED_STEPS`` differ from
    its most common outcome: a request rejected (or accepted) at every step says nothing of which
    request it is, and two unrelated ones would match."""
    frame = drafts.lazy() if isinstance(drafts, pl.DataFrame) else drafts
    by = [c for c in ("_run", "request") if c in frame.collect_schema().names()]
    steps = (frame.filter(pl.col("label").is_not_null())
             .group_by(*by, "step").agg(pl.len().alias("_v"), (pl.col("label") == 1).sum().alias("_a"))
             .with_columns((pl.col("_v").cast(pl.Int64) * 65536 + pl.col("_a").cast(pl.Int64)).alias("_o"))
             .sort(*by, "step").with_columns(pl.int_range(pl.len()).over(by).alias("_j"),
                                             pl.len().over(by).alias("_n"),
                                             pl.len().over(*by, "_o").alias("_same"))
             .with_columns(pl.col("_same").max().over(by).alias("_mode"))
             .filter((pl.col("_n") >= min_steps) & (pl.col("_n") - pl.col("_mode") >= MIN_VARIED_STEPS)).collect())
    if steps.height == 0:
        return pl.DataFrame(schema={**{c: pl.Int64 for c in by}, "signature": pl.String})
    code = steps["_o"].cast(pl.UInt64).to_numpy()
    j = steps["_j"].cast(pl.UInt64).to_numpy()
    h = _mix64(_mix64(code + np.uint64(0x9E3779B97F4A7C15)) ^ _mix64(j ^ np.uint64(0xC2B2AE3D27D4EB4F)))
    starts = np.flatnonzero(np.r_[True, (steps["_j"].to_numpy()[1:] == 0)])
    sums = np.add.reduceat(h, starts)  # uint64: wraps modulo 2**64
    n = steps["_n"].to_numpy()[starts].astype(np.uint64)
    sig = _mix64(sums ^ _mix64(n))
    keys = steps[starts.tolist()].select(by)
    return keys.with_columns(pl.Series("signature", [f"{int(x):016x}" for x in sig], dtype=pl.String))


def import_source(meta: dict) -> tuple[str, list[int]] | None:
    """The svt run an imported run was exported from (``import.svt_source`` in its run.json: the
    source's run id and, by the import's request index, the source's request id), if the file
    carried it. A damaged record (not ids, an id twice) is a ValueError naming what is wrong: it
    decides which requests a fit was trained on, so it is never ignored."""
    imp = meta.get("import") if isinstance(meta.get("import"), dict) else {}
    if "svt_source" not in imp:
        return None
    src = imp["svt_source"]
    rid, reqs = (src.get("run_id"), src.get("requests")) if isinstance(src, dict) else (None, None)
    if not isinstance(rid, str) or not rid:
        raise ValueError("`import.svt_source.run_id` is not a run id")
    if not isinstance(reqs, list) or not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r <= MAX_ID
                                             for r in reqs):
        raise ValueError("`import.svt_source.requests` is not a list of request ids (integers from 0)")
    if len(set(reqs)) != len(reqs):
        raise ValueError("`import.svt_source.requests` names a source request twice")
    return rid, reqs


MAX_ID = 2**62  # request ids are 64-bit integers in the tables
