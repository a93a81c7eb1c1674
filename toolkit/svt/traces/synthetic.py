"""A synthetic drafts table calibrated on a real run, for benchmarks at scale.

``resample_steps`` draws whole verification steps (all K drafts of one request's step, labels and
features together) with replacement from a real run and renumbers them into new requests of
``steps_per_request`` steps. Every joint property of a step that the metrics see (features,
positions, the label chain, acceptance by position) follows the source run; only the mix of steps
into requests is new. With the demo run as the source this gives the 4.5M-draft tables
`make bench` uses.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl


def resample_steps(drafts: pl.DataFrame, n_labelled: int, *, steps_per_request: int = 60,
                   seed: int = 0) -> pl.DataFrame:
    """About ``n_labelled`` labelled drafts (whole steps) resampled from ``drafts``."""
    keys = ["request", "step"]
    steps = drafts.select(keys).unique(maintain_order=True).with_row_index("_sid")
    d = drafts.join(steps, on=keys).sort("_sid", "position")
    per_step = d.group_by("_sid", maintain_order=True).agg(pl.col("label").is_not_null().sum().alias("n"))
    mean_labelled = per_step["n"].mean()
    n_steps = int(np.ceil(n_labelled / mean_labelled))
    rng = np.random.default_rng(seed)
    pick = pl.DataFrame({"_sid": rng.integers(0, steps.height, n_steps).astype(np.uint32),
                         "_new": np.arange(n_steps, dtype=np.int64)})
    out = pick.join(d, on="_sid", how="left", maintain_order="left")
    return out.with_columns(
        (pl.col("_new") // steps_per_request).alias("request"),
        (pl.col("_new") % steps_per_request).cast(pl.Int32).alias("step"),
    ).drop("_sid", "_new")


MAX_LABELLED = 4_000_000_000  # evaluation sorts one feature of at most 2**32 labelled drafts


def write_run(source: str | Path, out: str | Path, n_labelled: int, *, steps_per_request: int = 60,
              shard_labelled: int = 5_000_000, seed: int = 0) -> Path:
    """A synthetic run directory of about ``n_labelled`` labelled drafts, resampled (whole steps)
    from the run ``source`` and written shard by shard, so memory holds one shard at a time.

    Each shard holds whole batches of whole requests, its rows in replay order (batch, step,
    request, position), like the collector's; ``steps`` and ``requests`` follow the drafts (the
    requests have no token ids). run.json is the source's with new counts, shard records and a
    ``synthetic`` block naming the source, the size and the seed. The run is written beside
    ``out`` and moved into place when complete.
    """
    import uuid

    from svt.errors import ConfigError
    from svt.traces.io import open_run, record_shards, remove_partial, write_meta, write_shard

    out = Path(out)
    _check_args(source, out, n_labelled, shard_labelled, steps_per_request, seed)
    src = open_run(source)
    src.require_complete()
    bs = int((src.meta.get("config") or {}).get("batch_size", 1) or 1)
    keys = ["request", "step"]
    drafts = src.scan("drafts").collect()
    steps_src = src.scan("steps").collect()
    workload_of = dict(src.scan("requests").select("request", "workload").collect().iter_rows())
    sids = drafts.select(keys).unique().sort(keys).with_row_index("_sid")
    d = drafts.join(sids, on=keys).sort("_sid", "position")
    per_step = d.group_by("_sid").agg(pl.col("label").is_not_null().sum().alias("n"))
    if per_step.height == 0 or not per_step["n"].sum():
        raise ConfigError(f"{source} has no labelled drafts to resample (a reference run, or one whose every "
                          "step drafted nothing).")
    mean_labelled = float(per_step["n"].mean())
    # shards of whole batches: requests per shard a multiple of the batch size
    req_per_shard = max(bs, int(round(shard_labelled / mean_labelled / steps_per_request / bs)) * bs)
    n_requests = max(bs, int(np.ceil(n_labelled / mean_labelled / steps_per_request / bs)) * bs)
    tmp = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    meta = _synthetic_meta(src.meta, source, n_requests, n_labelled, steps_per_request, seed)
    import signal

    def _term(signum, frame):  # a plain `kill` cleans up like Ctrl-C
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _term) if _main_thread() else None
    try:
        written: dict[str, list[Path]] = {"drafts": [], "steps": [], "requests": []}
        labelled = accepted = n_drafts = n_steps_all = emitted = 0
        for shard, first in enumerate(range(0, n_requests, req_per_shard)):
            reqs = min(req_per_shard, n_requests - first)
            part, st, rq = _shard_frames(np.random.default_rng([seed, shard]), reqs * steps_per_request, first,
                                         steps_per_request, bs, sids, d, steps_src, workload_of)
            labelled += int(part["label"].is_not_null().sum())
            accepted += int((part["label"] == 1).sum())
            n_drafts += part.height
            n_steps_all += st.height
            emitted += int(st["emitted"].sum())
            for table, frame in (("drafts", part), ("steps", st), ("requests", rq)):
                written[table].append(write_shard(tmp, table, shard, frame))
        for table, paths in written.items():
            record_shards(meta, table, paths)
        meta["status"] = "complete"
        meta["synthetic"]["labelled"] = labelled
        meta["counts"] = {"requests": n_requests, "steps": n_steps_all, "drafts": n_drafts, "labelled": labelled,
                          "accepted": accepted, "output_tokens": emitted}
        write_meta(tmp, meta)
        os.replace(tmp, out)
    except BaseException:
        try:
            remove_partial(tmp)
        except KeyboardInterrupt:  # the same Ctrl-C, left pending by polars
            remove_partial(tmp)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return out


def _synthetic_meta(source_meta: dict, source, n_requests: int, n_labelled: int, steps_per_request: int,
                    seed: int) -> dict:
    """run.json of the synthetic run: the source's, with a new id, the new size and a ``synthetic`` block."""
    import json
    import uuid

    meta = json.loads(json.dumps(source_meta))
    meta.update({"run_id": uuid.uuid4().hex[:12], "status": "running", "shards": {}})
    meta["config"] = {**(meta.get("config") or {}), "requests": n_requests, "log": {"hidden": False,
                                                                                    "dists_fraction": 0.0}}
    meta["synthetic"] = {"source": str(source), "source_run_id": source_meta.get("run_id"),
                         "labelled_target": int(n_labelled), "steps_per_request": steps_per_request,
                         "seed": seed, "method": "whole steps resampled with replacement"}
    meta.pop("counts", None)
    return meta


def _check_args(source, out: Path, n_labelled: int, shard_labelled: int, steps_per_request: int,
                seed: int) -> None:
    from svt.errors import ConfigError

    for name, value in (("labelled drafts", n_labelled), ("labelled drafts per shard", shard_labelled),
                        ("steps per request", steps_per_request)):
        if not 1 <= value <= MAX_LABELLED:
            raise ConfigError(f"Expected {name} between 1 and {MAX_LABELLED:,}, but got {value!r}.")
    if seed < 0:
        raise ConfigError(f"Expected a seed >= 0, but got {seed}.")
    if out.exists():
        raise ConfigError(f"{out} exists; remove it or choose another output folder.")
    if out.resolve().is_relative_to(Path(source).resolve()):
        raise ConfigError(f"{out} is inside the source run {source}; write the synthetic run elsewhere.")
    stray = sorted(out.parent.glob(f".{out.name}.tmp-*")) if out.parent.is_dir() else []
    if stray:
        raise ConfigError(f"{stray[0]} is left from an interrupted write of {out}; delete it first.")


def _shard_frames(rng, n_steps: int, first: int, steps_per_request: int, bs: int, sids: pl.DataFrame,
                  d: pl.DataFrame, steps_src: pl.DataFrame, workload_of: dict):
    """One shard's drafts, steps and requests: ``n_steps`` source steps drawn with replacement,
    renumbered as requests ``first``, ``first + 1``, ... of ``steps_per_request`` steps, rows in
    replay order (batch, step, request, position)."""
    keys = ["request", "step"]
    pick = pl.DataFrame({"_sid": rng.integers(0, sids.height, n_steps).astype(np.uint32),
                         "_new": np.arange(n_steps, dtype=np.int64)})
    new = pick.join(sids, on="_sid", how="left", maintain_order="left").rename(
        {"request": "_src_req", "step": "_src_step"}).with_columns(
        (first + pl.col("_new") // steps_per_request).alias("request"),
        (pl.col("_new") % steps_per_request).cast(pl.Int32).alias("step"))
    part = (new.select("_sid", "request", "step").join(d.drop(keys), on="_sid", how="left")
            .with_columns((pl.col("request") // bs).alias("_b"))
            .sort("_b", "step", "request", "position").drop("_sid", "_b"))
    st = (new.join(steps_src.rename({"request": "_src_req", "step": "_src_step"}),
                   on=["_src_req", "_src_step"], how="left")
          .with_columns((pl.col("request") // bs).alias("_b")).sort("_b", "step", "request"))
    rq = (new.filter(pl.col("step") == 0).select(
        "request", pl.col("_src_req").replace_strict(workload_of, return_dtype=pl.String).alias("workload"))
        .with_columns(pl.lit([], dtype=pl.List(pl.Int32)).alias("prompt_ids"),
                      pl.lit([], dtype=pl.List(pl.Int32)).alias("output_ids"),
                      pl.lit("synthetic").alias("finish_reason")))
    return part, st, rq


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def main(argv=None) -> None:
    import argparse
    import math
    import sys

    from svt.errors import SvtError

    def count(text: str) -> int:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(v) or v < 1 or v != int(v) or v > MAX_LABELLED:
            raise argparse.ArgumentTypeError(f"expected a whole number between 1 and {MAX_LABELLED:,}, got {text!r}")
        return int(v)

    ap = argparse.ArgumentParser(prog="python -m svt.traces.synthetic",
                                 description="Write a synthetic run resampled from a real one (benchmarks at scale).")
    ap.add_argument("source", type=Path, help="a run directory (e.g. runs/demo)")
    ap.add_argument("out", type=Path, help="the new run directory (must not exist)")
    ap.add_argument("--labelled", type=count, required=True, help="labelled drafts, e.g. 1e8 (about 45 bytes "
                    "of disk each with the demo run as the source)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-labelled", type=count, default=5_000_000, help="labelled drafts per shard")
    args = ap.parse_args(argv)
    print(f"writing about {args.labelled:,} labelled drafts to {args.out} "
          f"(about {args.labelled * 45 / 1e9:.1f} GB with the demo run as the source)", flush=True)
    try:
        path = write_run(args.source, args.out, args.labelled, seed=args.seed, shard_labelled=args.shard_labelled)
    except SvtError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    except KeyboardInterrupt:
        print(f"interrupted: nothing was written to {args.out}", file=sys.stderr)
        raise SystemExit(130) from None
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
