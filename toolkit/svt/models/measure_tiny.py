"""Measure how the built-in pair behaves as a speculative pair (the figures in data/models/README.md).

    python -m svt.models.measure_tiny --requests 96 --out reports/tiny_pair.md

For each draft and for temperature 1 and greedy: collect on the three shipped workloads (K = 5,
128 new tokens), then report acceptance (overall, and by position in both conventions), mean
acceptance length, mean q_max, and how well q_max ranks acceptance (ROC AUC, scikit-learn).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import polars as pl

from svt.collect.runner import collect
from svt.config import load_collect_config
from svt.traces import open_run
from svt.traces.summary import acceptance_by_position, run_summary


def measure(models: Path, requests: int, max_new_tokens: int, seed: int = 0) -> str:
    from sklearn.metrics import roc_auc_score

    lines = []
    for draft in ("draft-small", "draft-large"):
        for temperature in (1.0, 0.0):
            base = {"target": str(models / "target"), "draft": str(models / draft),
                    "workloads": ["code", "prose", "structured"], "requests": requests,
                    "max_new_tokens": max_new_tokens, "k": 5, "temperature": temperature,
                    "device": "cpu", "seed": seed, "max_prompt_tokens": 384}
            cfg = load_collect_config(None, base=base)
            with tempfile.TemporaryDirectory() as tmp:
                run_dir = Path(tmp) / "run"
                collect(cfg, run_dir, config_path=Path("configs/collect/demo.yaml"), progress=False)
                s = run_summary(run_dir)
                pos = acceptance_by_position(run_dir)
                d = open_run(run_dir).scan("drafts").filter(pl.col("label").is_not_null())
                d = d.select("label", "q_max", "workload").collect()
                auc = roc_auc_score(d["label"].to_numpy(), d["q_max"].to_numpy())
                by_wl = d.group_by("workload").agg(pl.col("label").mean()).sort("workload")
            name = f"{draft}, {'T=1' if temperature else 'greedy'}"
            lines.append(
                f"| {name} | {s['labelled']:,} | {s['acceptance']:.3f} | {s['mean_acceptance_length']:.2f} | "
                f"{d['q_max'].mean():.3f} | {auc:.3f} | "
                + " / ".join(f"{r:.2f}" for r in pos["conditional"]) + " | "
                + " / ".join(f"{r:.2f}" for r in pos["marginal"]) + " | "
                + ", ".join(f"{w} {a:.2f}" for w, a in by_wl.iter_rows()) + " |"
            )
    head = ("| pair, sampling | labelled drafts | acceptance | mean acceptance length | mean q_max | "
            "AUC(q_max) | conditional rate by position 0-4 | marginal rate by position 0-4 | "
            "acceptance by workload |\n|---|---|---|---|---|---|---|---|---|")
    return head + "\n" + "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", type=Path, default=Path("data/models"))
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    table = measure(args.models, args.requests, args.max_new_tokens)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)


if __name__ == "__main__":
    main()
