"""The built-in drafters side by side on the same prompts (the demo config: held-out workloads, T = 1,
K = 5, continuous batches of 8): mean accepted length with the bonus token (tokens a request-step),
the acceptance by position, q_max's AUC, and each drafter's price from its own cost profile at
batch 1 (the draft of a K = 5 step over the verify of 6 tokens).

    python benchmarks/bench_drafters.py [--requests 48] [--tokens 96] [--drafters draft-large,eagle3,dflash,dspark]

Results go to reports/bench/drafters.json and drafters.md. Run it on a quiet machine (the profiles
measure wall-clock).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SVT = [sys.executable, "-m", "svt.cli"]


def _run(args: list[str]) -> None:
    r = subprocess.run([*SVT, *args], capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"svt {' '.join(args)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--drafters", default="draft-large,eagle3,dflash,dspark")
    args = ap.parse_args()
    import polars as pl
    import yaml
    from sklearn.metrics import roc_auc_score

    from svt.traces.io import open_run

    work = ROOT / "runs" / "bench-drafters"
    cfg = str(ROOT / "configs" / "collect" / "demo.yaml")
    rows = []
    for name in args.drafters.split(","):
        common = ["--set", f"draft=builtin:{name}", "--set", f"requests={args.requests}", "--set",
                  f"max_new_tokens={args.tokens}", "--set", "log.hidden=false", "--set", "log.dists_fraction=0",
                  "--set", "batch_size=8", "--quiet", "--overwrite"]
        out = work / name
        _run(["collect", cfg, "--out", str(out), *common])
        costs = work / f"costs-{name}.yaml"
        _run(["collect", cfg, "--profile-costs", "--out", str(costs), "--profile-batches", "1", *common])
        run = open_run(out)
        steps = run.scan("steps").select("emitted", "accepted").collect()
        d = run.scan("drafts").filter(pl.col("label").is_not_null()).select("position", "label", "q_max").collect()
        by_pos = d.group_by("position").agg(pl.col("label").mean()).sort("position")
        table = yaml.safe_load(costs.read_text())
        draft5 = float(table["draft_ms"][1][5])
        verify6 = float(table["verify_rows_ms"][1][6])
        rows.append({"drafter": name, "tokens_per_step": float(steps["emitted"].mean()),
                     "accepted_per_step": float(steps["accepted"].mean()),
                     "acceptance_by_position": [round(float(x), 4) for x in by_pos["label"]],
                     "q_max_auc": float(roc_auc_score(d["label"].to_numpy(), d["q_max"].to_numpy())),
                     "draft_ms_k5_b1": draft5, "verify_ms_6_b1": verify6, "draft_over_verify": draft5 / verify6,
                     "profile_reliable": bool(table["measurement"].get("reliable"))})
        print(json.dumps(rows[-1]), flush=True)
    base = next((r for r in rows if r["drafter"] == "eagle3"), None)
    out = ROOT / "reports" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "drafters.json").write_text(json.dumps(rows, indent=1))
    lines = ["# The built-in drafters on the same prompts", "",
             f"demo config, {args.requests} requests x {args.tokens} tokens, T = 1, K = 5, continuous batches of 8",
             "", "| drafter | tokens / step | vs EAGLE-3 | acceptance by position | q_max AUC | draft K=5 / verify 6 "
             "(ms, B = 1) | ratio |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        rel = f"{r['tokens_per_step'] / base['tokens_per_step']:.3f}x" if base else "—"
        lines.append(f"| {r['drafter']} | {r['tokens_per_step']:.3f} | {rel} | "
                     f"{', '.join(f'{x:.2f}' for x in r['acceptance_by_position'])} | {r['q_max_auc']:.3f} | "
                     f"{r['draft_ms_k5_b1']:.2f} / {r['verify_ms_6_b1']:.2f} | {r['draft_over_verify']:.2f} |")
    (out / "drafters.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
