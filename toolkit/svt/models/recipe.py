"""The built-in pair's recipe: a target that copies from its context, and drafts distilled from it.

Induction heads (a head that attends from a token to the token after its earlier occurrence, and a
circuit that writes that token) form after a number of training tokens that grows with
sqrt(B * C) (Aoyama, Wilcox and Schneider, arXiv 2511.16893, 2025) and sooner where spans repeat.
So the target is trained in stages, each a :func:`svt.models.induction_phase.run_phase` over the
same training stream with its own batch shape, learning-rate schedule and share of windows that
repeat a span (random-token strings written twice; the window's own text copied further on):

1. ``target-induction``: B=2, C=128 at a constant learning rate until the best head's induction
   score first reaches ``jump_score`` (the phase change), then ``after_jump_tokens`` more;
2. ``target-consolidate``: B=8, C=128 with more random repeats and a cosine decay (the copying
   sharpens once the step noise shrinks);
3. ``target-context``: B=8, C=512 on the stream and the task documents with a small share of
   repeats and a cosine decay: the positions up to 512 that a 384-token prompt plus 128 new tokens
   use, and the workloads' formats.

Then the target is rounded to bf16 (the saved precision) and fine-tuned by the last stage,
``target-unlikelihood`` (:mod:`svt.models.unlikelihood`: sequence-level unlikelihood on its own
greedy continuations against repeating its own output, mixed with ``target-context``'s likelihood
windows; kept only when the held-out loss and the induction gate stay within their limits), rounded
again, sharpened (``train_tiny.SHARPEN``) and the drafts are distilled from it: ``draft-small`` (1 layer: it cannot compose two attention layers,
so it cannot form an induction head) on 512-token windows as before, and ``draft-large`` (2 layers)
in two stages like the target's (C=128 with repeats, then C=512), so that it can copy too.

Every stage keeps a checkpoint in ``WORK/STAGE/`` (every ~10 minutes) and, when done, its model and
``result.json``; running the recipe again resumes the unfinished stage and skips the finished ones
(``make models`` does so). The induction gate (:mod:`svt.models.induction`) is measured through
every stage; its curve, the step of the jump and each stage's figures land in
``OUT/training.json``. ::

    python -m svt.models.recipe --out data/models --work build/tiny

``--device cuda`` runs the same stages on a GPU in bf16 autocast (no checkpoint is then comparable
with a CPU one: the work folder records the device).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from svt.models.induction import induction_gate, passes
from svt.models.induction_phase import PhaseConfig, run_phase
from svt.models.train_tiny import (
    DRAFTS,
    EOS,
    SHARPEN,
    TARGET,
    TinySpec,
    evaluate,
    make_model,
    prepare_data,
    save_pair,
    sharpen,
    train_one,
)
from svt.models.unlikelihood import UnlikelihoodConfig
from svt.models.unlikelihood import run_stage as run_unlikelihood

TARGET_STAGES = (
    ("target-induction", PhaseConfig(batch=2, context=128, lr=2e-3, warmup=200, random_share=0.25, copy_share=0.25,
                                     max_tokens=8_000_000, stop_on_gate=False, jump_score=0.3,
                                     after_jump_tokens=1_000_000, gate_every=250, seed=0)),
    ("target-consolidate", PhaseConfig(batch=8, context=128, lr=2e-3, warmup=50, random_share=0.35, copy_share=0.15,
                                       max_tokens=3_000_000, final_lr_share=0.1, stop_on_gate=False, gate_every=100,
                                       seed=1)),
    ("target-context", PhaseConfig(batch=8, context=512, lr=3e-4, warmup=50, random_share=0.3, copy_share=0.1,
                                   max_span=64, max_tokens=3_000_000, final_lr_share=0.1, stop_on_gate=False,
                                   gate_every=50,
                                   seed=2)),
)
DRAFT_LARGE_STAGES = (
    ("draft-large-induction", PhaseConfig(batch=4, context=128, lr=3e-3, warmup=100, random_share=0.25,
                                          copy_share=0.25, max_tokens=1_800_000, stop_on_gate=False,
                                          confidence_weight=2.0, gate_every=250, seed=3)),
    ("draft-large-context", PhaseConfig(batch=8, context=512, lr=1.5e-3, warmup=50, random_share=0.1, copy_share=0.1,
                                        max_tokens=900_000, final_lr_share=0.1, stop_on_gate=False,
                                        confidence_weight=2.0, gate_every=50, seed=4)),
)


def scaled_stages(stages, scale: float):
    """Every token budget multiplied by ``scale`` (smoke tests); gate every 5 steps when scaled."""
    if scale == 1.0:
        return stages
    return tuple((name, replace(cfg, max_tokens=max(cfg.batch * cfg.context, int(cfg.max_tokens * scale)),
                                after_jump_tokens=int(cfg.after_jump_tokens * scale),
                                warmup=max(1, int(cfg.warmup * scale)), gate_every=5))
                 for name, cfg in stages)


def scaled_unlikelihood(cfg: UnlikelihoodConfig, scale: float) -> UnlikelihoodConfig:
    """The unlikelihood stage's steps multiplied by ``scale`` (smoke tests), measured every 2 steps."""
    if scale == 1.0:
        return cfg
    return replace(cfg, steps=max(2, int(cfg.steps * scale)), warmup=1, eval_every=2, eval_prompts=4)


def unlikelihood_stage(model, stream, held, cfg: UnlikelihoodConfig, folder: Path, *, vocab: int, eos: int,
                       log=print) -> dict:
    """:func:`svt.models.unlikelihood.run_stage` as a recipe stage: a finished one (its
    ``result.json`` and model in FOLDER) is loaded instead of trained again."""
    result = _finished(model, folder, cfg)
    if result is not None:
        log(f"[target-unlikelihood] done earlier: {'accepted' if result['accepted'] else 'refused'}", flush=True)
        return result
    result = run_unlikelihood(model, stream, held, cfg, folder, vocab=vocab, eos=eos, log=log)
    _finish(model, folder, result)
    return result


def _finished(model, folder: Path, cfg) -> dict | None:
    """A finished stage's result (its weights loaded into ``model``), or None; a stage made with
    another config is refused."""
    done = folder / "result.json"
    if not done.is_file():
        return None
    result = json.loads(done.read_text())
    if result["config"] != asdict(cfg):
        raise SystemExit(f"{folder} was made with another stage config; remove it to train it again.")
    model.load_state_dict(torch.load(folder / "model.pt", weights_only=True))
    return result


def _finish(model, folder: Path, result: dict) -> None:
    """A stage's weights and ``result.json``, each written beside and swapped in."""
    torch.save(model.state_dict(), folder / "model.pt.tmp")
    (folder / "model.pt.tmp").replace(folder / "model.pt")
    tmp = folder / "result.json.tmp"
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(folder / "result.json")


def run_stages(model, stages, stream, work: Path, *, vocab: int, bos: int, teacher=None, log=print) -> list[dict]:
    """Each stage in turn, from the previous stage's weights; a finished stage (its ``result.json``
    and model in WORK/STAGE) is loaded instead of trained again."""
    results = []
    for name, cfg in stages:
        folder = work / name
        result = _finished(model, folder, cfg)
        if result is not None:
            log(f"[{name}] done earlier: {result['tokens']:,} tokens", flush=True)
        else:
            log(f"[{name}] {cfg}", flush=True)
            result = {"stage": name, **run_phase(model, stream, cfg, folder, vocab=vocab, bos=bos, teacher=teacher,
                                                 log=log)}
            _finish(model, folder, result)
        results.append(result)
    return results


def _gate(model, vocab: int, bos: int) -> dict:
    g = induction_gate(model, vocab=vocab, bos=bos)
    return {**g, "passes": passes(g)}


def _stage_summary(results: list[dict]) -> list[dict]:
    keep = ("stage", "tokens", "steps", "seconds", "jump_tokens", "jump_step", "config")
    out = []
    for r in results:
        last = r["curve"][-1] if r["curve"] else {}
        out.append({**{k: r.get(k) for k in keep},
                    "gate_at_end": {k: last.get(k) for k in ("top1", "cross_entropy", "max_induction_score")},
                    "curve": [{k: c.get(k) for k in ("step", "tokens", "lr", "loss", "top1", "cross_entropy",
                                                    "first_copy_cross_entropy", "max_induction_score")}
                              for c in r["curve"]]})
    return out


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("data/models"))
    ap.add_argument("--work", type=Path, default=Path("build/tiny"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every token budget (smoke tests)")
    ap.add_argument("--device", default="cpu", help="cpu (float32, the committed weights) or cuda (bf16 autocast)")
    ap.add_argument("--drafts-from", type=Path, default=None, metavar="TARGET",
                    help="train the drafts only, from this saved target (e.g. data/models/target after "
                         "`python -m svt.models.unlikelihood`), keeping its record in OUT/training.json")
    args = ap.parse_args(argv)
    if args.threads < 1 or not 0 < args.scale <= 1:
        ap.error("--threads must be >= 1 and --scale in (0, 1].")
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        ap.error(f"--device {args.device!r}: cpu or cuda[:N].")
    if args.device != "cpu" and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: torch sees no CUDA device here.")
    if args.drafts_from is not None:  # checked before any work (the data preparation takes half a minute)
        if not (args.drafts_from / "model.safetensors").is_file():
            ap.error(f"--drafts-from {args.drafts_from}: no model.safetensors there.")
        saved_target_record(args.out)
    # a checkpoint made on one device is not resumed on another (its numbers differ)
    args.work = args.work if args.device == "cpu" else args.work.with_name(args.work.name + "-cuda")
    return args


def train_target(args, stream, held, vocab: int, eos: int, figures: dict):
    """The target's stages, its unlikelihood stage, rounding and sharpening; its figures land in
    ``figures["models"]["target"]``."""
    target_stages = scaled_stages(TARGET_STAGES, args.scale)
    torch.manual_seed(args.seed)
    target = make_model(TARGET, eos).to(args.device)
    results = run_stages(target, target_stages, stream, args.work, vocab=vocab, bos=eos)
    target = target.to(torch.bfloat16).float()  # the saved precision: the drafts' teacher is the saved model
    # the last stage: unlikelihood against repeating its own output (refused, weights unchanged, if it
    # costs the held-out loss or the induction gate more than its limits)
    ul_cfg = scaled_unlikelihood(UnlikelihoodConfig(), args.scale)
    ul_result = unlikelihood_stage(target, stream, held, ul_cfg, args.work / "target-unlikelihood", vocab=vocab,
                                   eos=eos)
    target = target.to(torch.bfloat16).float()
    tokens = sum(r["tokens"] for r in results)
    figures["models"]["target"] = {
        "parameters": sum(p.numel() for p in target.parameters()),
        "tokens_seen": tokens,
        "train_seconds": round(sum(r.get("seconds", 0) for r in results), 1),
        **{k: round(v, 4) for k, v in evaluate(target, None, held).items()},
        "induction_gate": _gate(target, vocab, eos),
        "stages": _stage_summary(results),
        "unlikelihood": {k: ul_result[k] for k in ("accepted", "chosen_step", "before", "after", "config", "curve")},
    }
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)
    sharpen(target, SHARPEN)
    figures["models"]["target"]["sharpen"] = SHARPEN
    figures["models"]["target"]["held_out_loss_sharpened"] = round(evaluate(target, None, held)["held_out_loss"], 4)
    print(f"[target] {json.dumps({k: v for k, v in figures['models']['target'].items() if k != 'stages'})}",
          flush=True)
    return target


def saved_target_record(out: Path) -> dict:
    """OUT/training.json's target entry, checked to be this recipe's (sharpened as it sharpens)."""
    try:
        entry = json.loads((out / "training.json").read_text())["models"]["target"]
        sharpened = float(entry.get("sharpen", 0))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
        raise SystemExit(f"--drafts-from: {out}/training.json holds no target record ({exc}).") from None
    if sharpened != SHARPEN:
        raise SystemExit(f"--drafts-from: the saved target was sharpened by {entry.get('sharpen')}, this recipe by "
                         f"{SHARPEN}.")
    return entry


def saved_target(path: Path, out: Path, device: str):
    """A saved target (sharpened, as the drafts' teacher) and its entry of OUT/training.json."""
    from transformers import AutoModelForCausalLM

    entry = saved_target_record(out)
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    return target, entry


def state_id(model) -> str:
    """A short hash of a model's weights (what its drafts are distilled from)."""
    import hashlib

    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> None:
    args = _parse(argv)
    torch.set_num_threads(args.threads)
    from transformers import PreTrainedTokenizerFast

    t_start = time.time()
    args.work.mkdir(parents=True, exist_ok=True)
    tok, stream, held, figures = prepare_data(args.seed)
    eos = tok.token_to_id(EOS)
    vocab = tok.get_vocab_size()
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS, pad_token=EOS, unk_token=None)
    figures["recipe"] = "svt.models.recipe"

    if args.drafts_from is None:
        target = train_target(args, stream, held, vocab, eos, figures)
    else:  # the drafts only, from a saved (sharpened) target and its record
        target, figures["models"]["target"] = saved_target(args.drafts_from, args.out, args.device)
    target_id = state_id(target)
    figures["models"]["target"]["weights_state_sha256_16"] = target_id

    models = {"target": target} if args.drafts_from is None else {}  # a saved target stays as it is, byte for byte
    small, large = DRAFTS
    small_spec = TinySpec(**{**asdict(small), "train_tokens": int(small.train_tokens * args.scale)})
    draft_small, figures["models"][small.name] = train_one(small_spec, stream, held, eos, args.seed + 1,
                                                           teacher=target, device=args.device)
    figures["models"][small.name]["induction_gate"] = _gate(draft_small, vocab, eos)
    models[small.name] = draft_small

    torch.manual_seed(args.seed + 2)
    draft_large = make_model(large, eos).to(args.device)
    large_stages = scaled_stages(DRAFT_LARGE_STAGES, args.scale)
    # the drafts' stages are keyed by their teacher: a new target never resumes an old target's drafts
    results = run_stages(draft_large, large_stages, stream, args.work / f"drafts-{target_id}", vocab=vocab, bos=eos,
                         teacher=target)
    figures["models"][large.name] = {
        "parameters": sum(p.numel() for p in draft_large.parameters()),
        "tokens_seen": sum(r["tokens"] for r in results),
        "train_seconds": round(sum(r.get("seconds", 0) for r in results), 1),
        **{k: round(v, 4) for k, v in evaluate(draft_large, target, held).items()},
        "induction_gate": _gate(draft_large, vocab, eos),
        "stages": _stage_summary(results),
    }
    models[large.name] = draft_large
    figures["total_seconds_this_session"] = round(time.time() - t_start, 1)

    def spec_of(spec: TinySpec) -> TinySpec:
        return TinySpec(**{**asdict(spec), "train_tokens": figures["models"][spec.name]["tokens_seen"]})

    save_pair(args.out, models, hf_tok, figures, spec_of)
    print(f"saved to {args.out} ({figures['total_seconds_this_session']:.0f} s this session)")


if __name__ == "__main__":
    main()
