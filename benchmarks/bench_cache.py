"""Cache drafts and the HVD replay on the demo's greedy run (runs/hvd: 120 requests, 15,360 tokens).

    python benchmarks/bench_cache.py [--source runs/hvd] [--repeats 3]

Times, each the median of ``--repeats`` runs with the range beside it:

- ``cache replay``: SuffixDecoding (arctic-inference) proposals and feature rows at every decode
  position of every request, in server order (``cache_rows_for_batch``), without the model;
- ``model_accepted``: the teacher-forced draft forwards that give the model drafter's accepted
  length at every position (``teacher_forced_accepted``, batches of 8, CPU fp32);
- ``HVD replay``: the τ sweep (13 values) of one predictor plus the single-source policies and the
  oracle switch, over every request (``replay_hvd``).

Results go to reports/bench/cache.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
from rich.console import Console
from rich.table import Table

from svt.collect.cache import CacheDrafter, teacher_forced_accepted
from svt.collect.cache_run import cache_rows_for_batch
from svt.config import CacheOptions
from svt.features.char_classes import char_class_table
from svt.models import load_pair
from svt.simulate.cost_files import load_costs
from svt.simulate.hvd import HVDRequest, replay_hvd
from svt.traces import open_run

ROOT = Path(__file__).resolve().parents[1]


def _timed(fn, repeats: int) -> tuple[float, float, float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), float(min(times)), float(max(times)), out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--source", type=Path, default=ROOT / "runs" / "hvd")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "cache.json")
    args = ap.parse_args(argv)
    if not (args.source / "run.json").is_file():  # the demo's greedy run is the source; collect it once
        subprocess.run([sys.executable, "-m", "svt.cli", "collect", str(ROOT / "configs/collect/hvd.yaml"),
                        "--out", str(args.source), "--overwrite", "--quiet"], check=True)
    run = open_run(args.source)
    meta = run.meta
    options = CacheOptions(**meta["cache"]["options"])
    bs = int(meta["config"]["batch_size"])
    k = int(meta["k"])
    requests = run.scan("requests").sort("request").collect()
    steps = run.scan("steps").select("request", "step", "emitted").collect()
    pair = load_pair(meta["models"]["target"]["path"], meta["models"]["draft"]["path"], device="cpu", dtype="float32")
    classes = char_class_table(pair.tokenizer, int(pair.draft.config.vocab_size))
    batches = requests.with_columns((pl.col("request") // bs).alias("_b")).partition_by("_b", maintain_order=True)

    def cache_replay():
        drafter, n = CacheDrafter(options), 0
        for part in batches:
            n += len(cache_rows_for_batch(drafter, options, classes, part.drop("_b"),
                                          steps.filter(pl.col("request").is_in(part["request"].implode()))))
        return n

    seqs = list(zip(requests["prompt_ids"].to_list(), requests["output_ids"].to_list(), strict=True))
    cache = run.scan("cache_drafts").sort("request", "decode_pos").collect()
    reqs, preds = [], []
    for _, part in cache.group_by("request", maintain_order=True):
        reqs.append(HVDRequest(str(part["workload"][0]), part["draft_len"].to_numpy(),
                               part["oracle_accepted"].to_numpy(), part["model_accepted"].to_numpy(),
                               part["lookup_ms"].to_numpy().astype(np.float64)))
        preds.append(part["score"].to_numpy().astype(np.float64))
    costs = load_costs(ROOT / "configs" / "costs" / "h100-llama8b-eagle.yaml")
    results = {"positions": cache.height, "requests": requests.height, "repeats": args.repeats}
    for name, fn in (("cache replay", cache_replay),
                     ("model_accepted", lambda: teacher_forced_accepted(pair.draft, seqs, k)),
                     ("HVD replay", lambda: replay_hvd(reqs, {"score": preds}, k, costs))):
        med, lo, hi, out = _timed(fn, args.repeats)
        results[name] = {"median_s": med, "min_s": lo, "max_s": hi}
        if name == "cache replay" and out != cache.height:
            raise SystemExit(f"cache replay produced {out} rows, the table has {cache.height}")
        if name == "model_accepted":
            got = np.concatenate(out)
            if not np.array_equal(got, cache["model_accepted"].to_numpy()):
                raise SystemExit("model_accepted differs from the run's table")
    table = Table("work", "median s", "range s", title=f"cache drafts on {args.source} ({cache.height:,} positions, "
                                                          f"{requests.height} requests; {args.repeats} repeats)")
    for name in ("cache replay", "model_accepted", "HVD replay"):
        r = results[name]
        table.add_row(name, f"{r['median_s']:.3f}", f"{r['min_s']:.3f}-{r['max_s']:.3f}")
    Console(width=120).print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
