"""The live Hybrid Verified Decoding engine: one request at a time (one shard per request), greedy;
each cycle verifies the suffix cache's draft when its predicted yield clears tau, the model
drafter's otherwise (see :mod:`svt.collect.hvd_live` for a cycle)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import polars as pl

from svt.collect.cache import CacheDrafter, teacher_forced_accepted
from svt.collect.cache_run import dist_version
from svt.collect.engines import CollectOptions, Engine
from svt.collect.hvd_live import HVDLog, decode_hvd, yield_scorer
from svt.collect.plan import CollectPlan
from svt.collect.runner import request_shards, run_plan
from svt.config import CacheOptions, CollectConfig, resolve_path
from svt.errors import ConfigError
from svt.features.char_classes import char_class_table
from svt.metrics.repetition import common_prefix
from svt.traces.io import open_run, read_meta, write_meta
from svt.traces.rundir import RunSummary, commit_batch, completed_batches, finish_run
from svt.traces.schema import TABLES


class HvdEngine(Engine):
    """svt's engine under the live-HVD policy of the config's ``hvd:`` section."""

    name = "hvd"
    resumable = True

    def collect(self, cfg: CollectConfig, out: Path, options: CollectOptions) -> RunSummary:
        return run_plan(cfg, out, options, collect_hvd)


def _hvd_meta(plan: CollectPlan, fit_path: Path, options: CacheOptions) -> dict:
    cfg = plan.cfg
    meta = plan.new_meta()
    env = plan.environment()
    env.pop("threads")
    meta.update({
        "status": "running", "models": plan.pair.identity(),
        "sampling": {"temperature": 0.0, "top_p": cfg.top_p, "greedy": True,
                     "features_from": "unscaled softmax (T=1); greedy acceptance = argmax agreement"},
        "k": cfg.k, "drafter_kinds": ["model", "cache"], "av": None,
        "hvd": {"fit": str(fit_path), "tau": cfg.hvd.tau, "live": True,
                "note": "one request at a time; steps are HVD cycles (cache or model draft)"},
        "cache": {"options": options.to_dict(), "arctic_inference": dist_version("arctic-inference"),
                  "global_tree": "a response enters when its request finishes (after its last engine step)"},
        "workloads": plan.workloads.files, "workload_sha256": plan.workloads.hashes,
        "workload_reading": plan.workloads.reading,
        "seed": cfg.seed, "device": str(plan.pair.device), "environment": env,
        "batches": len(plan.ids),
    })
    return meta


def _request_frames(plan: CollectPlan, r: int, log: HVDLog) -> dict[str, pl.DataFrame]:
    """The shards of one decoded request: its model drafts, cycles, cache drafts (with both yields)
    and the request itself."""
    workload = plan.workload_of[r]
    output = np.asarray(log.output, dtype=np.int64)
    model = teacher_forced_accepted(plan.pair.draft, [(plan.ids[r], log.output)], plan.cfg.k,
                                    target=plan.pair.target)[0]
    rows = pl.DataFrame([{**row, "workload": workload,
                          "oracle_accepted": common_prefix(np.asarray(row["draft_ids"]), output[row["decode_pos"]:]),
                          "model_accepted": int(model[row["decode_pos"]])} for row in log.rows])
    steps = pl.DataFrame(log.cycles).with_columns(pl.lit(1).alias("batch_size"), pl.col("drafted").alias("kept"),
                                                  pl.lit(True).alias("explored"))
    if log.drafts:
        drafts = pl.DataFrame(log.drafts).with_columns(pl.lit(workload).alias("workload"))
    else:  # every cycle verified a cache draft: an empty drafts shard of the right schema
        drafts = pl.DataFrame(schema=TABLES["drafts"].columns)
    frames = {"drafts": drafts, "steps": steps, "cache_drafts": rows}
    return {**frames, **request_shards(plan, r, log.output, log.finish)}


def _record_cycles(out: Path) -> None:
    """run.json's HVD totals: cycles, tokens, cycles per 1,000 tokens and how many verified the cache."""
    run = open_run(out, deep=False)
    st = run.scan("steps").select(pl.len().alias("cycles"), pl.col("emitted").sum().alias("tokens")).collect().row(0)
    model_cycles = run.scan("drafts").select(pl.struct("request", "step").n_unique()).collect().item()
    meta = read_meta(out)
    meta["hvd"].update({"cycles": st[0], "tokens": st[1], "cycles_per_1000": 1000.0 * st[0] / max(st[1], 1),
                        "cache_cycles": st[0] - model_cycles})
    meta["cache"]["rows"] = run.scan("cache_drafts").select(pl.len()).collect().item()
    write_meta(out, meta)


def collect_hvd(plan: CollectPlan) -> RunSummary:
    """The hvd engine's body: every request not yet complete, decoded and committed in order."""
    cfg, pair, out = plan.cfg, plan.pair, plan.out
    if cfg.batch_size != 1:
        raise ConfigError("Live HVD decodes one request at a time: set `batch_size: 1` (compare it with a "
                          "greedy run collected at batch_size 1).")
    import arctic_inference  # noqa: F401  (its version is recorded in run.json)
    options = cfg.cache or CacheOptions()
    fit_path = resolve_path(cfg.hvd.fit, plan.config_path).resolve()
    from svt.fit import Fitter

    score = yield_scorer(Fitter.load(fit_path))
    classes = char_class_table(pair.tokenizer, int(pair.draft.config.vocab_size))
    drafter = CacheDrafter(options)
    done = sorted(completed_batches(out, plan.old_meta))
    if done:  # rebuild the global tree from the finished responses, in their order
        prev = open_run(out, deep=False, tables=["requests"]).scan("requests").sort("request").collect()
        for r in prev.iter_rows(named=True):
            drafter.start(r["request"], np.asarray(r["prompt_ids"]))
            drafter.finish(r["request"], np.asarray(r["output_ids"]))
    meta = _hvd_meta(plan, fit_path, options)
    write_meta(out, meta)
    t_start = time.time()
    for r in range(cfg.requests):
        if r in done:
            continue
        log = decode_hvd(pair.target, pair.draft, plan.ids[r], request=r, k=cfg.k, max_new_tokens=cfg.max_new_tokens,
                         eos_id=pair.tokenizer.eos_token_id, drafter=drafter, options=options, classes=classes,
                         predict_yield=score, tau=cfg.hvd.tau)
        commit_batch(out, meta, r, _request_frames(plan, r, log))
    summary = finish_run(out, meta, time.time() - t_start, resumed=len(done))
    _record_cycles(out)
    return summary
