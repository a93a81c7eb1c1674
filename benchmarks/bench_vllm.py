"""The vLLM plugin's overhead: tokens/s of the same offline vLLM run with and without tracing.

    .venv-vllm/bin/python benchmarks/bench_vllm.py [--pairs 2] [--rounds 3] [--requests 32]

Each contender is its own process (as a user's engine is): ``plain`` has the plugin installed but
``SVT_TRACE_DIR`` unset (so inert), ``traced`` has it set. Each process builds the engine, runs the
workload once untimed (warm-up), then ``--rounds`` timed rounds; a traced round includes writing its
rows to the spool. The two processes run one after the other, ``--pairs`` times, in alternating
order. The run is the built-in tiny pair at temperature 0 with greedy drafting, K = 5: greedy, so
both contenders do exactly the same work (the outputs are compared), and greedy drafting is the
plugin's dearest path (it recomputes the draft softmax). At temperature > 0 on vLLM 0.32.0's CPU
build the untraced engine samples with corrupted temperatures (see the plugin's notes), so the two
would not run the same tokens and a comparison would mean nothing.

Results go to reports/bench/vllm.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def worker(args) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from svt.collect.workloads import encode_prompt, interleave, read_workload
    from svt.vllm_plugin.recorder import active

    models = ROOT / "data" / "models"
    tok = AutoTokenizer.from_pretrained(str(models / "target"))
    prompts = interleave([read_workload(ROOT / "data" / "workloads" / f"{w}.jsonl")
                          for w in ("code", "prose", "structured")], args.requests)
    ids = [TokensPrompt(prompt_token_ids=encode_prompt(p, tok, 384)) for p in prompts]
    llm = LLM(model=str(models / "target"), dtype="float32", seed=0, max_num_seqs=8, max_model_len=1024,
              enforce_eager=True, speculative_config={"method": "draft_model", "model": str(models / "draft-large"),
                                                      "num_speculative_tokens": 5, "draft_sample_method": "greedy"})
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    rec = active()
    assert (rec is not None) == (args.worker == "traced"), "tracing is not what this contender needs"
    out = {"tokens_per_s": [], "outputs": None}
    for r in range(args.rounds + 1):
        t0 = time.perf_counter()
        res = llm.generate(ids, params, use_tqdm=False)
        if rec is not None:
            rec.flush()
        dt = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in res)
        if r > 0:  # round 0 is the warm-up
            out["tokens_per_s"].append(tokens / dt)
        out["outputs"] = [list(o.outputs[0].token_ids) for o in res]
    Path(args.out).write_text(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--worker", choices=["plain", "traced"])
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    from rich.console import Console
    from timing import fmt, summary

    results = {"plain": [], "traced": []}
    outputs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            order = ["plain", "traced"] if pair % 2 == 0 else ["traced", "plain"]
            for who in order:
                env = {k: v for k, v in os.environ.items() if k != "SVT_TRACE_DIR"}
                if who == "traced":
                    env["SVT_TRACE_DIR"] = f"{tmp}/trace-{pair}"
                out = f"{tmp}/{who}-{pair}.json"
                subprocess.run([sys.executable, __file__, "--worker", who, "--out", out, "--rounds", str(args.rounds),
                                "--requests", str(args.requests), "--max-tokens", str(args.max_tokens)],
                               env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                got = json.loads(Path(out).read_text())
                results[who] += got["tokens_per_s"]
                outputs[who] = got["outputs"]
    if outputs["plain"] != outputs["traced"]:
        raise SystemExit("bench_vllm: traced and plain runs emitted different tokens; the comparison is void.")
    plain, traced = summary(results["plain"]), summary(results["traced"])
    slow = summary([100 * (1 - t / p) for p, t in zip(results["plain"], results["traced"], strict=True)])
    report = {"what": "tokens/s of one offline vLLM run (tiny pair, CPU, greedy, K=5), plugin inert vs tracing",
              "requests": args.requests, "max_tokens": args.max_tokens, "plain_tokens_per_s": plain,
              "traced_tokens_per_s": traced, "slowdown_percent": slow}
    dest = ROOT / "reports" / "bench" / "vllm.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(report, indent=2) + "\n")
    c = Console()
    c.print(f"vLLM plugin overhead ({args.requests} requests x {args.max_tokens} tokens, "
            f"{plain['n']} rounds each, median [range])")
    c.print(f"  plain   {fmt(plain, ' tok/s', 0)}")
    c.print(f"  traced  {fmt(traced, ' tok/s', 0)}")
    c.print(f"  slowdown (per round pair) {fmt(slow, ' %', 1)}")
    c.print(f"wrote {dest}")


if __name__ == "__main__":
    main()
