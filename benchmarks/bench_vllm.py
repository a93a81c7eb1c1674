"""The vLLM plugin's overhead: tokens/s of the same offline vLLM run with and without tracing.

    .venv-vllm/bin/python benchmarks/bench_vllm.py [--rounds 12] [--requests 32] [--max-tokens 128]

One engine, one process: rounds alternate between vLLM's own code (the plugin's hooks removed, so
exactly what an untraced engine runs) and tracing (hooks installed, every row recorded and written
to the spool at the end of the round), in the order plain, traced, traced, plain, ... so that drift
hits both alike. Each contender first runs once untimed (warm-up). The run is the built-in tiny pair
on the CPU at temperature 0 with greedy drafting, K = 5: greedy, so both contenders emit exactly the
same tokens (checked), and greedy drafting is the plugin's dearest path (the draft softmax's
statistics on top of vLLM's argmax). At temperature > 0 on vLLM 0.32.0's CPU build an untraced
engine samples with corrupted temperatures (see the plugin's notes), so the two would not run the
same tokens and a comparison would mean nothing.

A separate process per contender was tried first: the process-to-process spread of this machine
(about ±10 % between two untraced processes) drowned the difference, hence one process.

Results go to reports/bench/vllm.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.pop("SVT_TRACE_DIR", None)
    from rich.console import Console
    from rich.markup import escape
    from timing import fmt, ratios, summary
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from svt.collect.encode import encode_prompt
    from svt.collect.workloads import interleave, read_workload
    from svt.vllm_plugin import internals
    from svt.vllm_plugin.recorder import activate, active, deactivate

    models = ROOT / "data" / "models"
    tok = AutoTokenizer.from_pretrained(str(models / "target"))
    prompts = interleave([read_workload(ROOT / "data" / "workloads" / f"{w}.jsonl")
                          for w in ("code", "prose", "structured")], args.requests)
    ids = [TokensPrompt(prompt_token_ids=encode_prompt(p, tok, 384)) for p in prompts]
    llm = LLM(model=str(models / "target"), dtype="float32", seed=0, max_num_seqs=8, max_model_len=1024,
              enforce_eager=True, speculative_config={"method": "draft_model", "model": str(models / "draft-large"),
                                                      "num_speculative_tokens": 5, "draft_sample_method": "greedy"})
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        rec = activate(tmp)

        def run(traced: bool):
            (internals.install if traced else internals.uninstall)()
            t0 = time.perf_counter()
            res = llm.generate(ids, params, use_tqdm=False)
            if traced:
                rec.flush()
            dt = time.perf_counter() - t0
            return dt, [list(o.outputs[0].token_ids) for o in res]

        times = {"plain": [], "traced": []}
        outputs = {}
        for who in ("plain", "traced"):  # warm-up
            run(who == "traced")
        for r in range(args.rounds):
            for who in (("plain", "traced") if r % 2 == 0 else ("traced", "plain")):
                dt, outputs[who] = run(who == "traced")
                times[who].append(dt)
        verified = rec.counters["verified_drafts"]
        deactivate()
        internals.uninstall()
    assert active() is None
    if outputs["plain"] != outputs["traced"]:
        raise SystemExit("bench_vllm: traced and plain rounds emitted different tokens; the comparison is void.")
    tokens = sum(len(o) for o in outputs["plain"])
    plain = summary([tokens / t for t in times["plain"]])
    traced = summary([tokens / t for t in times["traced"]])
    slow = summary([100 * (t / p - 1) for p, t in zip(times["plain"], times["traced"], strict=True)])
    report = {"what": "tokens/s of one offline vLLM run (tiny pair, CPU, greedy, K=5): vLLM's own code vs "
                      "tracing, alternating rounds in one engine", "requests": args.requests,
              "max_tokens": args.max_tokens, "tokens_per_round": tokens, "drafts_recorded": verified,
              "plain_tokens_per_s": plain, "traced_tokens_per_s": traced, "slowdown_percent": slow,
              "plain_over_traced": ratios(times["traced"], times["plain"])}
    dest = ROOT / "reports" / "bench" / "vllm.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(report, indent=2) + "\n")
    c = Console()
    c.print(escape(f"vLLM plugin overhead ({args.requests} requests x {args.max_tokens} tokens = {tokens} tokens "
                   f"per round, {plain['n']} rounds each, median [range])"))
    c.print(escape(f"  vLLM alone  {fmt(plain, ' tok/s', 0)}"))
    c.print(escape(f"  tracing     {fmt(traced, ' tok/s', 0)}"))
    c.print(escape(f"  slowdown    {fmt(slow, ' %', 1)} (time per round, traced / plain - 1, per round pair)"))
    c.print(f"wrote {dest}")


if __name__ == "__main__":
    main()
