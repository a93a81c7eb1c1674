"""Which rows a fit may be scored on: its held-out requests on the runs it was trained on, every
request of a run it never saw, and nothing it cannot tell apart from its training data.

A fit records its training requests three ways: their ids in their runs (``train_request_ids``),
their acceptance sequences (``train_request_signatures``: requests of 16 or more verified steps)
and their tokens (``train_token_signatures``: a hash of the prompt and output token ids, where the
run holds them). A run it is scored on is either one of its training runs (by run id, by the svt
run an import came from, or by equal data): then the ids split it; or a run it never saw: then every
request must be *shown* not to be a training request, by its tokens or by its acceptance sequence.
A request neither can check (an import without tokens, fewer than 16 verified steps) could be a
training request under another id: scoring it as held out is refused unless the caller asks for it
(``svt evaluate --score-unverified``), and the report's fit description then says how many such
requests were scored.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from contextvars import ContextVar

import numpy as np
import polars as pl

from svt.errors import ConfigError, DataError
from svt.fit.base import Fitter
from svt.traces.identity import (
    MIN_SIGNATURE_STEPS,
    import_source,
    model_pair,
    request_signatures,
    run_identity,
    same_data,
)
from svt.traces.io import open_run


def split_mask(drafts: pl.DataFrame, test_fraction: float, seed: int) -> np.ndarray:
    """True for rows of held-out requests: a seeded permutation of the (run, request) pairs."""
    if not 0 <= test_fraction < 1:
        raise ConfigError(f"Expected `test_fraction` in [0, 1), but got {test_fraction}.")
    keys = drafts.select("_run", "request").unique().sort("_run", "request")
    rng = np.random.default_rng(seed)
    n_test = int(round(test_fraction * keys.height))
    test = np.zeros(keys.height, dtype=bool)
    test[rng.permutation(keys.height)[:n_test]] = True
    keys = keys.with_columns(pl.Series("_test", test))
    return drafts.join(keys, on=["_run", "request"], how="left", maintain_order="left")["_test"].to_numpy()


def _seen(fit: Fitter, run_ids: list, paths: list | None) -> list[tuple[int | None, list[int] | None]]:
    """For each evaluated run, the index of the fit's training run it is (by run id, by the svt
    run an import was exported from, or by equal data for a re-collection under another id), else
    None; and for an import of a training run's export, the source request of each of its requests."""
    trained = (fit.training_ or {}).get("runs", [])
    out = []
    for i, rid in enumerate(run_ids):
        hit = next((j for j, t in enumerate(trained) if rid is not None and t.get("run_id") == rid), None)
        requests = None
        if hit is None and paths is not None:
            run = open_run(paths[i], deep=False)
            try:
                src = import_source(run.meta)
            except ValueError as exc:
                raise DataError(f"{paths[i]}: {exc}: the run's record of its source is damaged "
                                "(import it again from the export).") from None
            n = (run.meta.get("counts") or {}).get("requests")
            if src is not None and isinstance(n, int) and len(src[1]) != n:
                raise DataError(f"{paths[i]}: `import.svt_source.requests` has {len(src[1])} entries for {n} "
                                "requests: the run's record of its source is damaged (import it again).")
            if src is not None:
                hit = next((j for j, t in enumerate(trained) if t.get("run_id") == src[0]), None)
                requests = src[1] if hit is not None else None
            if hit is None:  # an identical re-collection: the same rows in the table the fit read
                idents: dict = {}
                for j, t in enumerate(trained):
                    data = t.get("data")
                    if not isinstance(data, dict):
                        continue
                    table = data.get("table") or "drafts"
                    if table not in idents:
                        idents[table] = run_identity(run, table)
                    # the same table's rows (an empty drafts table's identity, recorded by an older svt for a
                    # reference run, identifies nothing: this run's identity is of the table it has rows in)
                    if idents[table]["table"] == table and same_data(data, idents[table])[0]:
                        hit = j
                        break
        out.append((hit, requests))
    return out


# `svt evaluate --score-unverified`: score requests whose held-out status cannot be checked
SCORE_UNVERIFIED: ContextVar[bool] = ContextVar("svt_score_unverified", default=False)


@contextlib.contextmanager
def scoring_unverified(on: bool = True) -> Iterator[None]:
    """Within the block, requests a fit cannot be shown not to have trained on are scored (and the
    fit's description says how many) instead of refused."""
    token = SCORE_UNVERIFIED.set(bool(on))
    try:
        yield
    finally:
        SCORE_UNVERIFIED.reset(token)


SIGNATURES = {"_run": pl.Int64, "request": pl.Int64, "tokens": pl.String, "output": pl.String}
MIN_OUTPUT_TOKENS = 8  # an output this long identifies its request (a shorter one, "Yes.", may not)


def token_signatures(paths: list, keys: pl.DataFrame | None = None) -> pl.DataFrame:
    """``_run``, ``request``, ``tokens`` (16 hex digits of the prompt and output token ids; null
    where the run does not hold them: an import whose source lacks them) and ``output`` (of the
    output ids alone, when there are at least ``MIN_OUTPUT_TOKENS``) for every request of the runs
    ``paths``, or of ``keys`` (``_run``, ``request``) only."""
    frames = []
    for i, p in enumerate(paths):
        run = open_run(p, deep=False, tables=["requests"])
        lacks = set(run.lacks("requests"))
        r = run.scan("requests").select("request", "prompt_ids", "output_ids").collect()
        pairs = list(zip(r["prompt_ids"].to_list(), r["output_ids"].to_list(), strict=True))
        sig = [None if lacks & {"prompt_ids", "output_ids"} or a is None or b is None or (len(a) == 0 and len(b) == 0)
               else _digest(a, b) for a, b in pairs]
        # the output alone: another tool's tokenizer may render the prompt otherwise (a BOS, a template)
        # while the model's output is the same tokens
        out_sig = [None if "output_ids" in lacks or b is None or len(b) < MIN_OUTPUT_TOKENS else _digest([], b)
                   for _, b in pairs]
        frames.append(pl.DataFrame({"_run": [i] * r.height, "request": r["request"].to_list(), "tokens": sig,
                                    "output": out_sig}, schema=SIGNATURES))
    out = pl.concat(frames) if frames else pl.DataFrame(schema=SIGNATURES)
    if keys is not None:
        out = keys.select(pl.col("_run").cast(pl.Int64), pl.col("request").cast(pl.Int64)).join(
            out, on=["_run", "request"], how="left")
    return out


def _digest(prompt: list, output: list) -> str:
    h = hashlib.blake2b(digest_size=8)
    h.update(np.asarray(prompt, dtype=np.int64).tobytes())
    h.update(b"|")
    h.update(np.asarray(output, dtype=np.int64).tobytes())
    return h.hexdigest()


def training_tokens(paths: list, train: pl.DataFrame) -> dict:
    """The fit file's record of its training requests' tokens: their signatures, and how many
    training requests had no tokens to sign (then no run can be shown by its tokens not to be
    training data)."""
    sigs = token_signatures(paths, train.select("_run", "request").unique())
    return {"train_token_signatures": sorted(sigs["tokens"].drop_nulls().unique().to_list()),
            "train_output_signatures": sorted(sigs["output"].drop_nulls().unique().to_list()),
            "train_requests_without_tokens": int(sigs["tokens"].null_count())}


def _evidence(fit: Fitter, drafts: pl.DataFrame, paths: list | None) -> pl.DataFrame:
    """Per (``_run``, ``request``) of ``drafts``: ``_rep`` (it repeats a training request: the same
    tokens, or the same acceptance sequence over 16+ verified steps) and ``_known`` (whether either
    could be checked: the fit signed every training request's tokens and the run holds this one's,
    or the request is long and varied enough for an acceptance signature). ``drafts`` may instead be
    one row per request with its acceptance signature in ``_signature`` (null: none), computed
    where its drafts lie."""
    t = fit.training_ or {}
    ev = drafts.select(pl.col("_run").cast(pl.Int64), pl.col("request").cast(pl.Int64)).unique().with_columns(
        pl.lit(False).alias("_rep"), pl.lit(False).alias("_known"))
    tok = t.get("train_token_signatures")
    if tok is not None and t.get("train_requests_without_tokens") == 0 and paths is not None:
        outs = list(t.get("train_output_signatures") or [])
        ev = ev.join(token_signatures(paths, ev), on=["_run", "request"], how="left").with_columns(
            (pl.col("_rep") | pl.col("tokens").is_in(list(tok)).fill_null(False)
             | pl.col("output").is_in(outs).fill_null(False)).alias("_rep"),
            (pl.col("_known") | pl.col("tokens").is_not_null()).alias("_known")).drop("tokens", "output")
    acc = t.get("train_request_signatures")
    found = None
    if acc is not None and fit.table == "drafts" and "_signature" in drafts.columns:  # one row a request, signed
        found = drafts.select(pl.col("_run").cast(pl.Int64), pl.col("request").cast(pl.Int64),  # elsewhere (a cluster)
                              pl.col("_signature").alias("signature")).unique().drop_nulls("signature")
    elif acc is not None and fit.table == "drafts" and {"step", "label"} <= set(drafts.columns):
        found = request_signatures(drafts.select(pl.col("_run").cast(pl.Int64), pl.col("request").cast(pl.Int64),
                                                 "step", "label"))
    if found is not None:
        ev = ev.join(found, on=["_run", "request"], how="left").with_columns(
            (pl.col("_rep") | pl.col("signature").is_in(list(acc)).fill_null(False)).alias("_rep"),
            (pl.col("_known") | pl.col("signature").is_not_null()).alias("_known")).drop("signature")
    return ev


def _where(paths: list | None, run: int) -> str:
    return str(paths[run]) if paths is not None else f"run {run + 1}"


def _unverified(fit: Fitter, ev: pl.DataFrame, paths: list | None, notes: list | None, how: str) -> None:
    """Requests whose held-out status cannot be checked: refused, unless scoring them was asked for
    (then the fit's description says how many were scored)."""
    unknown = ev.filter(~pl.col("_known"))
    if unknown.height == 0:
        return
    if SCORE_UNVERIFIED.get():
        if notes is not None:
            notes.append(f"{unknown.height} request(s) scored whose held-out status svt could not verify "
                         "(--score-unverified)")
        return
    r = unknown.sort("_run", "request").row(0, named=True)
    t = fit.training_ or {}
    why = []
    if t.get("train_token_signatures") is None:
        why.append("the fit records no token signatures of its training requests (an older svt)")
    elif t.get("train_requests_without_tokens"):
        why.append(f"{t['train_requests_without_tokens']} of its training requests had no tokens to sign")
    else:
        why.append("the run does not hold these requests' prompt and output tokens")
    why.append(f"they have fewer than {MIN_SIGNATURE_STEPS} verified steps (or too few varied ones) for an "
               "acceptance signature" if fit.table == "drafts" else "its rows carry no acceptance sequence")
    raise DataError(
        f"{_where(paths, r['_run'])}: {unknown.height} of the {ev.height} requests {how} cannot be checked against "
        f"the {fit.name} fit's training requests (first: request {r['request']}): {'; and '.join(why)}. svt cannot "
        "tell whether they were held out: a copy of the training run under another id would score the fit on what "
        "it learned from. Evaluate on the fit's training run itself (its held-out requests), on a run with its "
        "prompt and output tokens, or pass --score-unverified to score them anyway (the report says so).")


def _repeated_requests(fit: Fitter, drafts: pl.DataFrame, paths: list | None, notes: list | None) -> np.ndarray:
    """Rows of runs the fit has not seen by id or data whose request repeats one of its training
    requests (the same tokens, or the same acceptance sequence step for step; see
    :func:`_evidence`): such a run is the fit's training data under another id (e.g. an import of a
    hand-written export), refused when most of its checkable requests are; a few repeated requests
    are left out of the scoring. Requests that cannot be checked are refused (:func:`_unverified`)."""
    ev = _evidence(fit, drafts, paths)
    per_run = ev.group_by("_run").agg(pl.col("_known").sum().alias("n"), pl.col("_rep").sum().alias("m")).sort("_run")
    for r in per_run.iter_rows(named=True):
        if r["m"] >= 3 and r["m"] >= 0.5 * r["n"]:
            raise DataError(
                f"{_where(paths, r['_run'])}: {r['m']} of its {r['n']} checkable requests repeat the {fit.name} fit's "
                "training requests (the same prompt and output tokens, or the same drafts verified and accepted at "
                f"every one of {MIN_SIGNATURE_STEPS}+ steps): it holds the fit's training data under another run id "
                "(a copy or import of its training run, or the run an import it was trained on came from), and "
                "scoring it would score the fit on what it learned from. Evaluate the fit on the run it was trained "
                "on (its held-out requests) or on new data; an import of `svt export`'s file of the training run "
                "itself carries the source's request ids and is scored on the held-out requests only.")
    _unverified(fit, ev, paths, notes, "of a run the fit never saw")
    rep = ev.filter("_rep").select("_run", "request", pl.lit(True).alias("_t"))
    if rep.height and notes is not None:
        notes.append(f"{rep.height} request(s) left out: they repeat its training requests")
    keys = drafts.select(pl.col("_run").cast(pl.Int64), pl.col("request").cast(pl.Int64))
    return keys.join(rep, on=["_run", "request"], how="left", maintain_order="left")["_t"].fill_null(False).to_numpy()


def check_pair(fit: Fitter, paths: list) -> None:
    """A yield fit predicts the model drafter's yield against the cache's: it applies only to runs
    of the model pair it was trained on (acceptance fits may be studied on another pair)."""
    if fit.target != "yield":
        return
    pairs = {json.dumps(t.get("pair"), sort_keys=True) for t in (fit.training_ or {}).get("runs", [])
             if t.get("pair")}
    for p in paths:
        pair = json.dumps(model_pair(open_run(p, deep=False).meta), sort_keys=True)
        if pairs and pair not in pairs:
            raise DataError(f"The {fit.name} fit was trained on runs of another model pair "
                            f"({', '.join(sorted(pairs))}) than {p} ({pair}); its yields would be another "
                            "drafter's. Fit it on runs of this pair.")


def evaluation_mask(fit: Fitter, drafts: pl.DataFrame, run_ids: list[str | None],
                    paths: list | None = None, notes: list[str] | None = None) -> np.ndarray:
    """Rows on which a fit may be scored: all rows for online fits (prequential) and for runs the
    fit was not trained on; the held-out requests of its own training runs otherwise. ``paths``
    (the runs' directories) let a re-collection of a training run be recognised by its data, and an
    import of its export by the source ids the export carried; ``notes`` gets a sentence for
    requests left out because they repeat training requests under another run id."""
    if paths is not None:
        check_pair(fit, paths)
    if fit.online:
        return np.ones(drafts.height, dtype=bool)
    seen = _seen(fit, run_ids, paths)
    index = [s for s, _ in seen]
    if all(s is None for s in index):
        return ~_repeated_requests(fit, drafts, paths, notes)
    training = fit.training_
    if index != list(range(len(training["runs"]))):
        raise DataError("Evaluate an offline fit on exactly the runs it was trained on (for its held-out "
                        "split) or on runs it has never seen; "
                        + ", ".join(f"run {i + 1} is its training run {s + 1}" for i, s in enumerate(index)
                                    if s is not None) + ".")
    keys = drafts.select(pl.col("_run").cast(pl.Int64), pl.col("request").cast(pl.Int64))
    keys = _source_requests(keys, seen, paths)
    ids = training.get("train_request_ids")
    if ids is not None and any(m is not None for _, m in seen):
        _check_source_map(fit, drafts, keys, ids, seen, paths, notes)
    if ids is not None:  # every request the fit did not train on
        trained_keys = pl.DataFrame(ids, schema={"_run": pl.Int64, "request": pl.Int64}, orient="row")
        return ~keys.join(trained_keys.with_columns(pl.lit(True).alias("_t")), on=["_run", "request"], how="left",
                          maintain_order="left")["_t"].fill_null(False).to_numpy()
    if any(m is not None for _, m in seen):
        raise DataError("This fit (from an older svt) does not list its training requests, so an import of its "
                        "training run cannot be split; evaluate it on the training run itself, or fit again.")
    return split_mask(drafts, training["test_fraction"], training["split_seed"])


def _check_source_map(fit: Fitter, drafts: pl.DataFrame, keys: pl.DataFrame, ids: list, seen: list,
                      paths: list | None, notes: list | None = None) -> None:
    """An import's source map against its data: every request it maps to a training request must
    repeat that training request (its tokens, or its acceptance sequence), and none it maps to a
    held-out one may (a map reversed, shifted, two ids swapped, or naming the training run over
    other data would score training requests as held out, or held-out ones not at all). A mapped
    request neither can check is refused (:func:`_unverified`)."""
    mapped = [i for i, (_, m) in enumerate(seen) if m is not None]
    frame = drafts.with_columns(keys["request"].alias("_src")).filter(pl.col("_run").is_in(mapped))
    ev = _evidence(fit, frame, paths)
    if ev.height == 0:
        return
    src = frame.select(pl.col("_run").cast(pl.Int64), pl.col("request").cast(pl.Int64), "_src").unique()
    trained = pl.DataFrame(ids, schema={"_run": pl.Int64, "_src": pl.Int64}, orient="row").with_columns(
        pl.lit(True).alias("_trained"))
    ev = (ev.join(src, on=["_run", "request"], how="left").join(trained, on=["_run", "_src"], how="left")
          .with_columns(pl.col("_trained").fill_null(False)))
    bad = ev.filter(pl.col("_known") & (pl.col("_trained") != pl.col("_rep"))).sort("_run", "request")
    if bad.height:
        r = bad.row(0, named=True)
        how = ("is mapped to training request {src} but does not repeat any training request"
               if r["_trained"] else "is mapped to held-out request {src} but repeats a training request")
        raise DataError(f"{_where(paths, r['_run'])}: request {r['request']} " + how.format(src=r["_src"])
                        + f" ({bad.height} such of {ev.filter('_known').height} checkable requests): run.json's "
                        "`import.svt_source` does not describe this data, so which requests the fit trained on is "
                        "unknown. Import the export again, or evaluate on the training run itself.")
    _unverified(fit, ev, paths, notes, "that an import's source map names")


def _source_requests(keys: pl.DataFrame, seen: list, paths: list | None) -> pl.DataFrame:
    """``keys`` (_run, request) with each import's requests renamed to its source run's (the map
    its run.json holds); a request the map does not cover is a damaged run.json, not a guess."""
    maps = [pl.DataFrame({"_run": i, "request": range(len(m)), "_src": m},
                         schema={"_run": pl.Int64, "request": pl.Int64, "_src": pl.Int64})
            for i, (_, m) in enumerate(seen) if m is not None]
    if not maps:
        return keys
    mapped = [i for i, (_, m) in enumerate(seen) if m is not None]
    keys = keys.join(pl.concat(maps), on=["_run", "request"], how="left", maintain_order="left")
    lost = keys.filter(pl.col("_run").is_in(mapped) & pl.col("_src").is_null())
    if lost.height:
        r = lost.row(0, named=True)
        where = str(paths[r["_run"]]) if paths is not None else f"run {r['_run'] + 1}"
        raise DataError(f"{where}: request {r['request']} is not in run.json's `import.svt_source.requests` "
                        f"({len(seen[r['_run']][1])} entries): the run's record of its source is damaged.")
    return keys.select("_run", pl.coalesce("_src", "request").alias("request"))
