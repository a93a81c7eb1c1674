"""Run the built-in tiny pair through an offline vLLM engine and dump what vLLM returned (JSON).

Used by test_engine.py in a fresh process per engine. Tracing follows the environment, as in a
user's own vLLM process: the plugin is loaded by vLLM's entry point and records only when
SVT_TRACE_DIR is set.

    python vllm_generate.py OUT.json --draft draft-large --temperature 1 --requests 8
"""

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--draft", default="draft-large")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--draft-sample-method", default="probabilistic")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from svt.collect.encode import encode_prompt
    from svt.collect.workloads import interleave, read_workload
    from svt.vllm_plugin.collect import request_seed

    models = ROOT / "data" / "models"
    tok = AutoTokenizer.from_pretrained(str(models / "target"))
    prompts = interleave([read_workload(ROOT / "data" / "workloads" / f"{w}.jsonl") for w in ("code", "prose")],
                         args.requests)
    ids = [encode_prompt(p, tok, 256) for p in prompts]
    llm = LLM(model=str(models / "target"), dtype="float32", seed=0, max_num_seqs=8, max_model_len=1024,
              enforce_eager=True, per_request_spec_decode_metrics="detailed",
              speculative_config={"method": "draft_model", "model": str(models / args.draft),
                                  "num_speculative_tokens": args.k,
                                  "draft_sample_method": args.draft_sample_method})
    params = [SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=request_seed(0, i))
              for i in range(len(ids))]
    outs = llm.generate([TokensPrompt(prompt_token_ids=x) for x in ids], params, use_tqdm=False)
    from svt.vllm_plugin.recorder import deactivate
    from svt.vllm_plugin.state import active

    traced = active() is not None
    deactivate()
    metrics = [o.outputs[0].spec_decode_metrics for o in outs]
    Path(args.out).write_text(json.dumps({
        "request_ids": [o.request_id for o in outs],
        "prompt_ids": ids,
        "output_ids": [list(o.outputs[0].token_ids) for o in outs],
        "per_step_accepted": [list(m.per_step_accepted) if m else None for m in metrics],
        "per_step_drafted": [list(m.per_step_drafted) if m else None for m in metrics],
        "traced": traced,
        "internals_loaded": "svt.vllm_plugin.internals" in sys.modules,
    }))
