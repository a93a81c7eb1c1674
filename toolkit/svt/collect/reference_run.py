"""Reference runs (``svt collect --engine reference``): what a suffix cache and Hybrid Verified
Decoding would buy on real text, with no target forward at all.

Each prompt's reference (the continuation a strong model or a person wrote: logged traffic, or the
built-in workloads' real file text) is taken as the output, tokenized with the target's tokenizer.
The run's ``cache_drafts`` hold the SuffixDecoding draft at every position with its oracle yield
against the reference, and the model drafter's yield from either

- a real drafter teacher-forced on the reference (``draft:``): its greedy agreement with the text,
  the accepted length a lossless greedy verifier would grant if the target had written the text. A
  draft model reads the text alone; a hidden-state drafter (EAGLE-3, MTP, DFlash, DSpark) reads the
  target's hidden states of it, so the target runs one teacher-forced forward per batch of requests
  (the only target forward of a reference run); or
- a stand-in drafter (``stand_in:``) whose conditional acceptance by position is given: at each
  position, draft i is accepted with probability ``accept[i]`` when drafts 0..i-1 were, drawn
  independently per position from the run's seed and the request id (so the draws do not depend
  on batching). It is labelled as a stand-in in run.json and in every report.

Timing of the global tree: the requests of a batch advance one token per step and a response enters
the tree after its last token, as a server without speculation would see the finishes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import platform
import time
import uuid
from pathlib import Path

import numpy as np
import polars as pl

from svt import __version__
from svt.collect.cache_run import teacher_forced_model_yields
from svt.collect.encode import check_positions, encode_workloads, head_fits, position_limit
from svt.collect.engines import CollectOptions, Engine
from svt.collect.workloads import load_workloads
from svt.config import CacheOptions, CollectConfig, StandInConfig, resolve_path, to_dict
from svt.errors import ConfigError, DataError
from svt.simulate.stand_in import expected_tokens_per_cycle, stand_in_yields
from svt.traces.io import read_meta, write_meta
from svt.traces.rundir import RunSummary
from svt.traces.schema import SCHEMA_VERSION, TABLES


def measured_acceptance(run_path: Path, k: int) -> np.ndarray:
    """A run's conditional acceptance at each draft position (accepted / verified there)."""
    from svt.traces.io import open_run

    run = open_run(run_path, deep=False, tables=["drafts", "requests"])
    run.require_complete()
    if not (run.meta.get("counts") or {}).get("drafts"):
        raise DataError(f"stand_in.from_run: {run_path} has no model drafts (a reference or cache-only run): "
                        "there is no measured acceptance to copy.")
    if run.meta.get("k") != k:
        raise ConfigError(f"stand_in.from_run: {run_path} was drafted with K = {run.meta.get('k')}, but this run's "
                          f"k is {k}; set `k: {run.meta.get('k')}`.")
    by = (run.uncensored_drafts().filter(pl.col("label").is_not_null()).group_by("position")
          .agg(pl.len().alias("n"), (pl.col("label") == 1).sum().alias("a")).sort("position").collect())
    if by.height != k:
        raise DataError(f"stand_in.from_run: {run_path} has verified drafts at {by.height} of its {k} positions; "
                        "the acceptance of every position is needed.")
    return (by["a"] / by["n"]).to_numpy().astype(np.float64)


def stand_in_accept(stand_in: StandInConfig, k: int, config_path=None) -> tuple[np.ndarray, dict]:
    """The stand-in's per-position conditional acceptance and what run.json says about it."""
    if stand_in.accept is not None:
        acc, source = np.asarray(stand_in.accept, dtype=np.float64), "given per position"
    elif stand_in.rate is not None:
        acc, source = np.full(k, float(stand_in.rate)), "one rate at every position"
    else:
        path = resolve_path(stand_in.from_run, config_path)
        acc, source = measured_acceptance(path, k), f"measured in {path}"
    return acc, {"kind": "stand-in", "accept": acc.tolist(), "source": source,
                 "tokens_per_cycle": expected_tokens_per_cycle(acc),
                 "note": "a stand-in drafter: acceptance drawn independently per position from the given "
                         "rates (no model forward); its yields say nothing about a real drafter's correlations "
                         "with the text"}


def _stand_in_model_yields(accept: np.ndarray, seed: int):
    def model_yields(part: pl.DataFrame) -> list[np.ndarray]:
        return [stand_in_yields(accept, seed, int(r), len(o))
                for r, o in zip(part["request"].to_list(), part["output_ids"].to_list(), strict=True)]
    return model_yields


def _drafter(cfg_draft: str | None, stand_in: dict | None, k: int, seed: int, tokenizer, device: str,
             dtype: str, target_path: Path):
    """(model_yields, the draft model or None, run.json's ``drafter`` entry)."""
    if stand_in is not None:
        acc = np.asarray(stand_in["accept"], dtype=np.float64)
        return _stand_in_model_yields(acc, seed), None, stand_in
    from svt.models.loading import (
        check_draft_tokenizer,
        check_model_dir,
        load_causal_lm,
        resolve_device,
        resolve_dtype,
        weights_hash,
    )

    path = Path(cfg_draft)
    check_model_dir(path, "draft")
    from svt.models.heads import is_head_dir

    if is_head_dir(path):  # EAGLE-3, MTP, DFlash, DSpark: they draft from the target's hidden states
        return _hidden_state_drafter(path, target_path, k, device, dtype)
    check_draft_tokenizer(tokenizer, target_path, path)
    dev = resolve_device(device)
    model = load_causal_lm(path, "draft", dev, resolve_dtype(dtype, dev))
    if len(tokenizer) > model.config.vocab_size:
        raise ConfigError(f"The tokenizer has {len(tokenizer)} tokens but the draft only {model.config.vocab_size}.")
    entry = {"kind": "model", "path": str(path), "weights_sha256_16": weights_hash(path),
             "note": "a real drafter teacher-forced on the reference: its accepted length is its greedy agreement "
                     "with the text (what a greedy verifier grants if the target wrote the text)"}
    return teacher_forced_model_yields(model, k), model, entry


def _hidden_state_drafter(path: Path, target_path: Path, k: int, device: str, dtype: str):
    """A hidden-state drafter (an EAGLE-3 or MTP head, a DFlash or DSpark block drafter) over its
    target: the target runs teacher-forced over prompt + reference, a batch of requests a forward
    (its tapped hidden states held for that batch only), and the drafter drafts K from every position
    as it drafts in serving, its own recurrence for the later slots; its accepted length at a
    position is its greedy agreement with the reference (:func:`svt.collect.cache.teacher_forced_accepted`,
    the function a greedy run's cache drafts use, tested equal to live greedy decoding)."""
    from svt.models.loading import load_pair, weights_hash

    pair = load_pair(target_path, path, device=device, dtype=dtype)  # the head bound to its target, checked
    if pair.draft_kind in ("dflash", "dspark") and k > pair.draft.cfg.n_drafts:
        raise ConfigError(f"`k` = {k}, but the {pair.draft_kind} drafter's block has {pair.draft.cfg.n_drafts} draft "
                          f"slots: set k <= {pair.draft.cfg.n_drafts}.")
    entry = {"kind": "head", "head": pair.draft_kind, "path": str(path), "weights_sha256_16": weights_hash(path),
             "target": {"path": str(target_path), "weights_sha256_16": weights_hash(target_path)},
             "note": f"a {pair.draft_kind} drafter over its target, teacher-forced on the reference: the target's "
                     "hidden states of prompt + reference feed it at every position; its accepted length is its "
                     "greedy agreement with the text (what a greedy verifier grants if the target wrote the text)"}
    # the cache's character classes come from the tokenizer (a head has no config of its own): no model here
    return teacher_forced_model_yields(pair.draft, k, target=pair.target), None, entry


def collect_reference(cfg: CollectConfig, out: str | Path, *, config_path=None, overwrite: bool = False,
                      progress: bool = True):
    """Write a reference run: requests (the reference as output), cache drafts, no model drafts."""
    from svt.collect.cache_run import build_cache_drafts
    from svt.models.loading import check_model_dir, load_tokenizer, weights_hash
    from svt.traces.rundir import finish_run, prepare_dir, writing

    final = Path(out)
    config = to_dict(cfg)
    prepare_dir(final, resume=False, overwrite=overwrite, config=config)  # fails fast; again while held
    target_path = resolve_path(cfg.target, config_path).resolve()
    check_model_dir(target_path, "target (its tokenizer)")
    tok = load_tokenizer(target_path)
    keep = head_fits(tok, cfg.max_prompt_tokens, cfg.max_new_tokens) if cfg.on_long_head == "skip" else None
    workloads = load_workloads(cfg.workloads, cfg.requests, config_path, turns=cfg.turns, repeat=cfg.repeat,
                               need_reference=True, on_missing_reference=cfg.on_missing_reference, keep=keep)
    encoded = encode_workloads(workloads, tok, cfg.max_prompt_tokens, cfg.max_new_tokens, cfg.on_long_head)
    prompts = workloads.prompts
    ids = [e.prompt_ids for e in encoded]
    refs = [e.reference_ids for e in encoded]
    cut = [e.cut for e in encoded]
    stand_in = None if cfg.stand_in is None else stand_in_accept(cfg.stand_in, cfg.k, config_path)[1]
    draft_path = None if cfg.draft is None else resolve_path(cfg.draft, config_path).resolve()
    # the text stands for what the target served: it must fit the target (and a teacher-forced draft)
    lengths = [len(x) + len(r) for x, r in zip(ids, refs, strict=True)]
    limits = [(position_limit(target_path), "the target")]
    if draft_path is not None:
        limits.append((position_limit(draft_path), "the draft"))
    for limit, what in limits:
        check_positions(prompts, lengths, limit, what,
                        "Lower `max_prompt_tokens` or `max_new_tokens` (the reference's tokens kept).")
    model_yields, draft_model, drafter = _drafter(None if draft_path is None else str(draft_path), stand_in, cfg.k,
                                                  cfg.seed, tok, cfg.device, cfg.dtype, target_path)
    options = cfg.cache or CacheOptions()

    # always written beside --out and moved in when complete: a run killed midway leaves --out as it was
    # (an old run, an empty folder or nothing); a reference run is quick to redo, so it has no --resume
    t0 = time.time()
    with writing(final, overwrite=overwrite,
                 check=lambda: prepare_dir(final, resume=False, overwrite=overwrite, config=config)) as run_dir:
        _write_requests(run_dir, cfg, config, prompts, ids, refs, cut, workloads, target_path, tok,
                        drafter, weights_hash(target_path))
        summary = finish_run(run_dir, read_meta(run_dir), 0.0, resumed=0)
        with _progress(progress, len(prompts)) as advance:
            build_cache_drafts(run_dir, options, draft_model, tok, model_yields=model_yields, progress=advance)
        meta = read_meta(run_dir)
        meta["last_session_seconds"] = round(time.time() - t0, 2)
        write_meta(run_dir, meta)
        summary.seconds = time.time() - t0
    summary.run_dir = final
    return summary


@contextlib.contextmanager
def _progress(show: bool, total: int):
    """A progress bar over the requests (``advance(n)``), or None when it is not shown."""
    if not show:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("[bold]reference"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
                   TimeElapsedColumn())
    task = bar.add_task("reference", total=total)
    with bar:
        yield lambda n: bar.update(task, advance=n)


def _write_requests(run_dir: Path, cfg: CollectConfig, config: dict, prompts, ids, refs, cut, workloads,
                    target_path: Path, tok, drafter: dict, target_hash: str) -> None:
    """run.json and the requests (the references as outputs; ``finish_reason`` ``length`` where
    max_new_tokens cut the reference), with empty drafts and steps tables."""
    from svt.traces.rundir import commit_batch

    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "run_id": uuid.uuid4().hex[:12], "svt_version": __version__, "schema_version": SCHEMA_VERSION,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "config": config,
        "status": "running", "engine": "reference",
        "models": {"target": {"path": str(target_path), "weights_sha256_16": target_hash,
                              "note": ("its hidden states of prompt + reference feed the hidden-state drafter (one "
                                       "teacher-forced forward per batch; no decoding)") if drafter["kind"] == "head"
                              else "tokenizer only: a reference run makes no target forward"},
                   "tokenizer": {"path": str(target_path), "vocab_size": len(tok)},
                   **({"draft": {"path": drafter["path"], "weights_sha256_16": drafter["weights_sha256_16"]}}
                      if drafter["kind"] in ("model", "head") else {})},
        "sampling": {"temperature": 0.0, "top_p": 1.0, "greedy": True, "reference": True,
                     "features_from": "none: a reference run has no target probabilities (its output is the "
                                      "reference text)"},
        "k": cfg.k, "drafter_kinds": ["cache"], "drafter": drafter, "av": None,
        "reference": {"output": "each prompt's reference, tokenized with the target's tokenizer, its first "
                                f"max_new_tokens = {cfg.max_new_tokens} tokens",
                      "lacks": "target probabilities: no acceptance features, AV replay or losslessness audit"},
        "workloads": workloads.files, "workload_sha256": workloads.hashes, "workload_reading": workloads.reading,
        "seed": cfg.seed, "device": "none (no model)" if drafter["kind"] == "stand-in" else cfg.device,
        "environment": {"python": platform.python_version()},
        "batches": -(-len(prompts) // cfg.batch_size),
    }
    write_meta(run_dir, meta)
    empty = {t: pl.DataFrame(schema=TABLES[t].columns) for t in ("drafts", "steps")}
    for b, lo in enumerate(range(0, len(prompts), cfg.batch_size)):
        reqs = list(range(lo, min(lo + cfg.batch_size, len(prompts))))
        frames = dict(empty) if b == 0 else {}
        frames["requests"] = pl.DataFrame(
            {"request": reqs, "workload": [prompts[r].workload for r in reqs], "prompt_ids": [ids[r] for r in reqs],
             "output_ids": [refs[r] for r in reqs],
             "finish_reason": ["length" if cut[r] else "stop" for r in reqs]},
            schema_overrides={"prompt_ids": pl.List(pl.Int32), "output_ids": pl.List(pl.Int32)})
        commit_batch(run_dir, meta, b, frames)


def recache_reference(run_dir: Path, options: CacheOptions, device: str = "auto", *, target: Path | None = None,
                      draft: Path | None = None) -> dict:
    """``svt cache`` on a reference run: the same drafter (the stand-in's recorded rates and seed, or
    the draft model) with new cache options. The tokenizer's model and the draft must hash as run.json
    records (``target`` / ``draft`` where they moved)."""
    from svt.collect.cache_run import build_cache_drafts
    from svt.errors import ModelLoadError
    from svt.models.loading import load_tokenizer, weights_hash

    meta = read_meta(run_dir)
    models = meta.get("models") or {}

    def located(role: str, moved: Path | None, info: dict) -> Path:
        path = Path(str(moved or info.get("path", "")))
        if not path.is_dir():
            raise ModelLoadError(f"{run_dir}: run.json names the {role} at {str(path)!r}, which is not a directory "
                                 f"here; pass --{role.split()[0]} DIR.")
        if info.get("weights_sha256_16") and weights_hash(path) != info["weights_sha256_16"]:
            raise ModelLoadError(f"{path}: its weights differ from the {role} this run was made with "
                                 f"(hash {weights_hash(path)} vs {info['weights_sha256_16']}).")
        return path

    tok_path = located("target (tokenizer)", target, models.get("target") or {})
    tok = load_tokenizer(tok_path)
    drafter = meta.get("drafter") or {}
    k, seed = int(meta["k"]), int(meta.get("seed", 0))
    if drafter.get("kind") == "stand-in":
        if draft is not None:
            raise ConfigError(f"{run_dir}: a stand-in reference run has no draft model; --draft does not apply.")
        model_yields, model, _ = _drafter(None, drafter, k, seed, tok, device, "auto", tok_path)
    elif drafter.get("kind") in ("model", "head"):
        path = located("draft", draft, drafter)
        model_yields, model, _ = _drafter(str(path), None, k, seed, tok, device, "auto", tok_path)
    else:
        raise DataError(f"{run_dir}: run.json does not say which drafter the reference run used (`drafter.kind`).")
    return build_cache_drafts(run_dir, options, model, tok, model_yields=model_yields)


class ReferenceEngine(Engine):
    """No target forward: each prompt's reference is the output (see the module docstring)."""

    name = "reference"

    def collect(self, cfg: CollectConfig, out: Path, options: CollectOptions) -> RunSummary:
        return collect_reference(cfg, out, config_path=options.config_path, overwrite=options.overwrite,
                                 progress=options.progress)
