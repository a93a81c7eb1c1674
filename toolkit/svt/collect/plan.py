"""A collection planned before anything is written: the config, where the run goes, the model pair,
the encoded prompts, the batches and the live policy. Everything that can fail on bad input fails
in :func:`plan_collection`, before the run directory is touched."""

from __future__ import annotations

import datetime as dt
import functools
import platform
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from svt import __version__
from svt.collect.encode import check_positions, encode_workloads, long_head_filter, position_limit
from svt.collect.engine import LiveAV
from svt.collect.workloads import WorkloadSet, load_workloads
from svt.config import CollectConfig, resolve_path, to_dict
from svt.devices import available_cores
from svt.errors import ConfigError
from svt.models.loading import ModelPair, load_pair
from svt.traces.rundir import prepare_dir, staging_path
from svt.traces.schema import SCHEMA_VERSION


@dataclass
class CollectPlan:
    """What the svt and hvd engines run. ``out`` is where the run is written: ``final`` itself, or
    a staging folder beside it when an existing run is overwritten (swapped in once complete)."""

    cfg: CollectConfig
    config: dict  # the config as run.json records it
    config_path: Path | None
    final: Path
    out: Path
    staged: bool
    old_meta: dict | None  # run.json of the run being resumed
    pair: ModelPair
    workloads: WorkloadSet
    ids: list[list[int]]  # encoded prompts, one per request
    refs: dict[int, list[int]]  # encoded references of the prompts that carry one
    batches: list[list[int]]
    live: LiveAV | None = None
    online: object | None = None  # the online estimator of a live-AV run with `av.online`
    shard: tuple[int, int] | None = None
    progress: bool = True

    @functools.cached_property
    def workload_of(self) -> dict[int, str]:
        return {i: p.workload for i, p in enumerate(self.workloads.prompts)}

    def new_meta(self) -> dict:
        """run.json's fields common to every run of the plan (a resumed run keeps its own)."""
        return self.old_meta or {
            "run_id": uuid.uuid4().hex[:12],
            "svt_version": __version__,
            "schema_version": SCHEMA_VERSION,
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "config": self.config,
        }

    def environment(self) -> dict:
        return {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": __import__("transformers").__version__, "threads": torch.get_num_threads(),
                "cores_available": available_cores()}


def check_resume_inputs(out: Path, old_meta: dict, pair, workload_hashes: dict[str, str]) -> None:
    """A resumed run must use the same models (weights and config.json hashes) and prompt files (content hashes)
    as the session that started it: otherwise one run would mix two experiments."""
    now = pair.identity()
    for role in ("target", "draft"):
        was = (old_meta.get("models") or {}).get(role, {}).get("weights_sha256_16")
        if was and was != now[role]["weights_sha256_16"]:
            raise ConfigError(f"Cannot resume {str(out)!r}: the {role} model's weights changed since the run "
                              f"started (hash {now[role]['weights_sha256_16']} vs {was}). Use --overwrite.")
        was = (old_meta.get("models") or {}).get(role, {}).get("config_sha256_16")
        if was and was != now[role].get("config_sha256_16"):  # a head's taps, rope, norms: another drafter
            raise ConfigError(f"Cannot resume {str(out)!r}: the {role} model's config.json changed since the run "
                              f"started (hash {now[role].get('config_sha256_16')} vs {was}); one run would mix two "
                              "models. Use --overwrite.")
    was = old_meta.get("workload_sha256") or {}
    for name, h in workload_hashes.items():
        if name in was and was[name] != h:
            raise ConfigError(f"Cannot resume {str(out)!r}: the prompt file of workload {name!r} changed since "
                              "the run started. Use --overwrite.")


def check_resume_prompts(out: Path, ids: list[list[int]]) -> None:
    """The requests a resumed run committed must be the prompt tokens this session picks for them:
    the same config and prompt files can pick other rows or tokens (a changed picking rule, such
    as `on_long_head: skip` now leaving long rows out before picking; a chat template), and one run
    would then mix two sets of prompts."""
    import polars as pl

    from svt.traces.io import list_shards

    files = list_shards(out, "requests")
    if not files:
        return
    done = pl.read_parquet(files, columns=["request", "prompt_ids"])
    for r, p in zip(done["request"].to_list(), done["prompt_ids"].to_list(), strict=True):
        if not 0 <= r < len(ids) or list(p) != list(ids[r]):
            raise ConfigError(f"Cannot resume {str(out)!r}: request {r} was committed with other prompt tokens than "
                              "this session picks for it (how svt picks or tokenizes the prompts changed since the "
                              "run started). Use --overwrite.")


def live_policy(cfg: CollectConfig, config_path: Path | None, resume: bool) -> tuple[LiveAV | None, object | None]:
    """The live-AV policy (and its online estimator) of a config with ``av:``; checked in full here."""
    if cfg.av is None:
        return None, None
    from svt.fit import Fitter, live_confidence
    from svt.simulate.cost_files import load_costs

    fit = Fitter.load(resolve_path(cfg.av.fit, config_path))
    confidence = live_confidence(fit)  # a lossless feature, a known model
    costs = load_costs(resolve_path(cfg.av.costs, config_path))
    costs.check_covers(cfg.k, f"{cfg.av.costs}: ")
    if not cfg.av.online:
        return LiveAV(confidence, costs, cfg.av.explore, rule=cfg.av.rule, length=cfg.av.length), None
    if resume:
        raise ConfigError("Cannot resume a live-AV run with `av.online: true`: the estimator's state is "
                          "not saved between sessions. Use --overwrite.")
    from dataclasses import replace

    from svt.fit.live import OnlineLive

    if not fit.online:
        raise ConfigError("`av.online: true` needs an online fit, e.g. irls-online (its options are used).")
    online = OnlineLive(replace(fit.options), cfg.k)
    return LiveAV(online.confidence, costs, cfg.av.explore, online.observe, online.warming_up,
                  rule=cfg.av.rule, length=cfg.av.length), online


def drafter_columns(pair: ModelPair) -> set[str]:
    """The optional drafts columns the pair's drafter logs (``confidence``: a confidence head's)."""
    head = getattr(pair.draft, "confidence_head", None)
    return {"confidence"} if head is not None else set()


def check_av_columns(cfg: CollectConfig, pair: ModelPair, config_path: Path | None) -> None:
    """Live AV on a feature this drafter does not compute (the ``confidence`` of a drafter with no
    confidence head) is one error naming the feature and the drafter, before any work."""
    from svt.features import OPTIONAL_COLUMNS, get_feature
    from svt.fit import Fitter

    fit = Fitter.load(resolve_path(cfg.av.fit, config_path))
    names = getattr(fit, "features", None) or [fit.feature]
    have = drafter_columns(pair)
    for name in names:
        for col in sorted(set(get_feature(name).expr.meta.root_names()) & set(OPTIONAL_COLUMNS) - have):
            raise ConfigError(f"`av.fit` scores the feature {name!r}, which reads `{col}`: only {OPTIONAL_COLUMNS[col]} "
                              f"computes it, and the draft {cfg.draft!r} ({pair.draft_kind}) does not.")


def plan_collection(cfg: CollectConfig, out: Path, *, config_path: Path | None, resume: bool, overwrite: bool,
                    progress: bool, shard: tuple[int, int] | None) -> CollectPlan:
    """Check everything and load the pair; then clear the staging folder of an overwrite."""
    config = to_dict(cfg)
    if shard is not None:
        from svt.collect.shards import check_shardable

        check_shardable(cfg)
    old_meta = prepare_dir(out, resume=resume, overwrite=overwrite, config=config)
    workloads = load_workloads(cfg.workloads, cfg.requests, config_path, turns=cfg.turns, repeat=cfg.repeat,
                               keep=long_head_filter(cfg, config_path))
    pair = load_pair(resolve_path(cfg.target, config_path), resolve_path(cfg.draft, config_path),
                     device=cfg.device, dtype=cfg.dtype)
    if pair.draft_kind in ("dflash", "dspark"):
        if cfg.tree is not None:
            raise ConfigError(f"The draft {cfg.draft!r} is a block-parallel drafter ({pair.draft_kind}): it drafts one "
                              "chain a block; svt's draft trees are built from heads and draft models. Remove `tree`.")
        if cfg.k > pair.draft.cfg.n_drafts:
            raise ConfigError(f"`k` = {cfg.k}, but the {pair.draft_kind} drafter's block has {pair.draft.cfg.n_drafts} "
                              f"draft slots (block_size {pair.draft.cfg.block_size}): set k <= {pair.draft.cfg.n_drafts}.")
    if old_meta:
        check_resume_inputs(out, old_meta, pair, workloads.hashes)
    live, online = live_policy(cfg, config_path, resume)
    if live is not None:
        check_av_columns(cfg, pair, config_path)
    if cfg.hvd is not None:
        from svt.collect.hvd_live import yield_scorer
        from svt.fit import Fitter

        yield_scorer(Fitter.load(resolve_path(cfg.hvd.fit, config_path)))
    encoded = encode_workloads(workloads, pair.tokenizer, cfg.max_prompt_tokens, cfg.max_new_tokens, cfg.on_long_head)
    prompts = workloads.prompts
    ids = [e.prompt_ids for e in encoded]
    refs = {i: e.reference_ids for i, e in enumerate(encoded) if e.reference_ids is not None}
    limits = [n for n in (position_limit(pair.target_path), position_limit(pair.draft_path)) if n is not None]
    check_positions(prompts, [len(x) + cfg.max_new_tokens + cfg.k + 1 for x in ids], min(limits, default=None),
                    "the target or the draft", "Lower `max_prompt_tokens` or `max_new_tokens`.")
    if old_meta:
        check_resume_prompts(out, ids)
    # an overwrite is written beside the old run and swapped in when complete
    staged = overwrite and out.is_dir() and any(out.iterdir())
    target = staging_path(out) if staged else out
    if staged:
        shutil.rmtree(target, ignore_errors=True)
    n = len(prompts)
    batches = [list(range(i, min(i + cfg.batch_size, n))) for i in range(0, n, cfg.batch_size)]
    return CollectPlan(cfg, config, config_path, out, target, staged, old_meta, pair, workloads, ids, refs, batches,
                       live, online, shard, progress)


def batch_seed(seed: int, batch: int) -> int:
    """The seed of one batch's random stream (a resumed run redraws a batch exactly)."""
    return int(np.random.SeedSequence([seed, batch]).generate_state(1, dtype=np.uint64)[0] >> 1)
