"""Collector throughput against transformers' own generation, side by side in one run.

    make bench            # or: python benchmarks/bench_collect.py --prompts 16 --max-new-tokens 64

Same pair (built-in target + draft-large), same prompts (the first N of the `code` workload), same
sampling (temperature 1, K = 5), float32 on CPU, 2 threads:

- ``hf generate``: plain sampling, batch 1 (no speculation);
- ``hf assisted``: ``generate(assistant_model=draft)`` with a constant 5-token schedule, batch 1
  (transformers refuses batch > 1 for assisted generation);
- ``svt collect``: the full collector (logging every draft, hidden states and a dists sample, and
  writing Parquet shards), batch 1, 8 and 16 (the demo's);
- ``bare forwards``: the collector's floor, the forward passes alone of the same shapes, replayed
  from the collected run: per batch the two prefills, then per step a draft forward of 2 tokens,
  K - 1 of 1 token and a target forward of K + 1 tokens, over the rows still decoding at that
  step (the engine's cache layout: the slots each step's logged acceptance kept, compacted when
  the engine compacts; random token ids; no sampling, verification, logging or writing). ``collector / floor`` is the full collection's wall time over the floor's for the same
  work: what the collector's own code costs on top of the models.

Figures are output tokens per second of wall time, excluding model loading. Results are printed
and written to reports/bench/collect.json. Numbers on a shared machine move by ~10%: compare the
ratios within one run, not across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from svt.collect import collect  # noqa: E402
from svt.collect.encode import encode_prompt  # noqa: E402
from svt.collect.workloads import read_workload  # noqa: E402
from svt.config import load_collect_config  # noqa: E402
from svt.models import load_pair  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from timing import fmt, summary  # noqa: E402


def hf_rate(model, prompts, max_new, assistant=None, k=5, seed=0) -> tuple[float, int]:
    torch.manual_seed(seed)
    n_tok = 0
    t0 = time.perf_counter()
    for ids in prompts:
        x = torch.tensor([ids], device=model.device)
        kwargs = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new,
                      min_new_tokens=max_new, attention_mask=torch.ones_like(x))
        if assistant is not None:
            kwargs["assistant_model"] = assistant
        out = model.generate(x, **kwargs)
        n_tok += out.shape[1] - x.shape[1]
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return n_tok / (time.perf_counter() - t0), n_tok


def bare_forward_seconds(pair, run_dir: Path, k: int, batch_size: int) -> float:
    """Wall time of the forward passes alone that the collection of ``run_dir`` made (see the
    module doc): the same batches, prompt widths and rows per step, and the same cache layout: each
    step keeps the slots the logged acceptance kept, and the caches compact when the engine's do."""
    import polars as pl

    from svt.collect.engine import _Cache
    from svt.traces import open_run

    run = open_run(run_dir)
    reqs = run.scan("requests").select("request", "prompt_ids").sort("request").collect()
    steps = run.scan("steps").select("request", "step", "accepted").sort("request").collect()
    device = next(pair.target.parameters()).device
    vocab = pair.target.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    kr = torch.arange(k + 1, device=device)[None, :]
    t0 = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, reqs.height, batch_size):
            batch = reqs.slice(start, batch_size)
            B = batch.height
            width = max(max(len(p) for p in batch["prompt_ids"]) - 1, 1)
            by_step = (steps.filter(pl.col("request").is_between(start, start + B - 1))
                       .group_by("step", maintain_order=True).agg("request", "accepted").sort("step"))
            ids = torch.randint(0, vocab, (B, width), generator=gen).to(device)
            tc, dc = _Cache(pair.target, B, device), _Cache(pair.draft, B, device)
            # left-padded prompts, as the engine's prefill (prompt[:-1]; the last token is fed next)
            pmask = (torch.arange(width)[None, :] >= torch.tensor(
                [width - (len(p) - 1) for p in batch["prompt_ids"]])[:, None]).long().to(device)
            tc.forward(ids, pmask)
            dc.forward(ids, pmask)
            has_unseen = torch.zeros(B, dtype=torch.long, device=device)
            plan = list(zip(by_step["request"].to_list(), by_step["accepted"].to_list(), strict=True))
            for j, (req, acc) in enumerate(plan):
                nb = len(req)
                tok = torch.randint(0, vocab, (nb, k + 1), generator=gen).to(device)
                dc.forward(tok[:, :2], torch.stack([has_unseen, torch.ones_like(has_unseen)], 1))
                one = torch.ones((nb, 1), dtype=torch.long, device=device)
                for i in range(k - 1):
                    dc.forward(tok[:, i : i + 1], one)
                tc.forward(tok, torch.ones((nb, k + 1), dtype=torch.long, device=device))
                a = torch.tensor(acc, device=device)
                tc.restrict_last(kr < (a + 1)[:, None])
                dc.restrict_last((kr < 2) | (kr - 2 < a[:, None]))
                has_unseen = (a == k).long()
                if j + 1 == len(plan):  # every row has finished: the engine drops them all
                    break
                nxt = plan[j + 1][0]
                if nxt != req:  # finished rows leave both caches, then the caches compact
                    keep = torch.tensor([req.index(r) for r in nxt], device=device)
                    tc.select(keep)
                    dc.select(keep)
                    has_unseen = has_unseen.index_select(0, keep)
                tc.compact()
                dc.compact()
            if device.type == "cuda":
                torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "collect.json")
    ap.add_argument("--device", default="cpu", help="cpu (make bench) or cuda (scripts/gpu_check.sh)")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    models = ROOT / "data" / "models"
    pair = load_pair(models / "target", models / "draft-large", device=args.device, dtype=args.dtype)
    wl = read_workload(ROOT / "data" / "workloads" / "code.jsonl")[: args.prompts]
    prompts = [encode_prompt(p, pair.tokenizer, 384) for p in wl]
    for m in (pair.target, pair.draft):
        m.generation_config.pad_token_id = pair.tokenizer.pad_token_id
    gc = pair.draft.generation_config
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = 5, "constant"
    gc.assistant_confidence_threshold = 0.0

    hf_rate(pair.target, prompts[:2], 8)  # warm-up
    base = {"target": str(models / "target"), "draft": str(models / "draft-large"),
            "workloads": [str(ROOT / "data" / "workloads" / "code.jsonl")], "requests": args.prompts,
            "max_new_tokens": args.max_new_tokens, "k": 5, "temperature": 1.0, "device": args.device,
            "dtype": args.dtype,
            "max_prompt_tokens": 384, "log": {"hidden": True, "dists_fraction": 0.02}}

    floor: dict[int, list[float]] = {1: [], 8: [], 16: []}

    def svt_rate(bs):
        cfg = load_collect_config(None, {"batch_size": bs}, base=base)
        with tempfile.TemporaryDirectory() as tmp:
            s = collect(cfg, Path(tmp) / "run", progress=False)
            # the same work's forward passes alone, right after (the floor of this round)
            bare = bare_forward_seconds(pair, Path(tmp) / "run", 5, bs)
        floor[bs].append(s.seconds / bare)
        # EOS can end a request early; the rate counts the tokens actually produced
        return s.output_tokens / s.seconds

    fns = {"hf generate (batch 1)": lambda: hf_rate(pair.target, prompts, args.max_new_tokens)[0],
           "hf assisted (batch 1)": lambda: hf_rate(pair.target, prompts, args.max_new_tokens, pair.draft)[0],
           "svt collect (batch 1, logging all)": lambda: svt_rate(1),
           "svt collect (batch 8, logging all)": lambda: svt_rate(8),
           "svt collect (batch 16, logging all)": lambda: svt_rate(16)}
    rates: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(args.repeats):  # side by side: one of each per round
        for name, fn in fns.items():
            rates[name].append(fn())
    ref = rates["hf assisted (batch 1)"]
    rows = {k: summary(v) for k, v in rates.items()}
    vs = {k: summary([a / b for a, b in zip(v, ref, strict=True)]) for k, v in rates.items()}
    over = {bs: summary(v) for bs, v in floor.items()}
    table = Table("path", "tokens/s: median (range)", "vs hf assisted (per round)", "collector / floor",
                  title=f"collector throughput (tiny pair, {args.device} {args.dtype}; {args.repeats} rounds)")
    for name in fns:
        bs = int(name.split("batch ")[1].split(",")[0].rstrip(")"))
        table.add_row(name, fmt(rows[name], digits=0), fmt(vs[name], "x"),
                      fmt(over[bs], "x") if name.startswith("svt") else "")
    Console(width=200).print(table)  # off a terminal too: no wrapped cells
    result = {"prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
              "tokens_per_s": rows, "ratio_vs_assisted": vs,
              "collector_over_bare_forwards": {f"batch {bs}": v for bs, v in over.items()},
              "torch": torch.__version__, "threads": torch.get_num_threads(), "device": args.device,
              "dtype": args.dtype}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
