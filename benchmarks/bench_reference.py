"""Reference runs (`svt collect --engine reference`): tokens per second on the built-in workloads'
real text, with a stand-in drafter (no model forward), with the real draft model teacher-forced, and
with the EAGLE-3 head over the target's teacher-forced hidden states, side by side.

    python benchmarks/bench_reference.py [--requests 480] [--max-new-tokens 512] [--repeats 3]

Each figure is the median of ``--repeats`` whole collections (tokenizing, SuffixDecoding proposals
and feature rows at every position, the drafter's yields, writing the run) with the range beside it,
and the seconds a million reference tokens would take at that rate. Results go to
reports/bench/reference.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from svt.collect.reference_run import collect_reference
from svt.config import load_collect_config

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=480)
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "reference.json")
    args = ap.parse_args(argv)
    base = ROOT / "configs" / "collect" / "hvd-reference.yaml"
    variants = {
        "stand-in (no model)": {"draft": None, "stand_in": {"rate": 0.7}},
        "draft-large teacher-forced": {},
        # a hidden-state drafter: the target's teacher-forced forward feeds the head at every position
        "EAGLE-3 head over the target": {"draft": "builtin:eagle3"},
    }
    rows = {}
    tmp = Path(tempfile.mkdtemp(prefix="svt-bench-ref-"))
    try:
        for name, over in variants.items():
            cfg = load_collect_config(base, {"requests": args.requests, "max_new_tokens": args.max_new_tokens,
                                             "device": "cpu", **over})
            times, tokens = [], 0
            for i in range(args.repeats):
                out = tmp / f"{len(rows)}-{i}"
                t0 = time.perf_counter()
                s = collect_reference(cfg, out, config_path=base, progress=False)
                times.append(time.perf_counter() - t0)
                tokens = s.output_tokens
                shutil.rmtree(out)
            med = float(np.median(times))
            rows[name] = {"tokens": tokens, "seconds_median": med, "seconds_min": min(times),
                          "seconds_max": max(times), "tokens_per_s": tokens / med,
                          "seconds_per_million": 1e6 * med / tokens}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ref = rows["draft-large teacher-forced"]["seconds_median"]
    table = Table(title=f"reference runs: {args.requests} requests, up to {args.max_new_tokens} tokens each "
                        f"(median of {args.repeats}, range)")
    for col in ("variant", "tokens", "seconds", "tokens / s", "s per 10^6 tokens", "time vs teacher-forced"):
        table.add_column(col)
    for name, r in rows.items():
        table.add_row(name, f"{r['tokens']:,}", f"{r['seconds_median']:.1f} ({r['seconds_min']:.1f}-{r['seconds_max']:.1f})",
                      f"{r['tokens_per_s']:,.0f}", f"{r['seconds_per_million']:.0f}", f"{r['seconds_median'] / ref:.2f}")
    Console(width=160).print(table)
    result = {"requests": args.requests, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
