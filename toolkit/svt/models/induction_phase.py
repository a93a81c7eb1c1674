"""Phase 1 of the tiny target's recipe (issue 33): cross the induction phase change cheaply.

Induction heads form after a number of training tokens that grows with sqrt(B * C) (B sequences of
C tokens per step; Aoyama, Wilcox and Schneider, arXiv 2511.16893, 2025) and earlier where bigrams
repeat often in the data. So this phase trains the target on short windows of the training stream
in small batches, with a share of windows that repeat a span inside them:

- a random-token string written twice (``random_share`` of the windows): a span of uniform random
  tokens, then the same span again, at a random place in the window;
- the window's own text repeated (``copy_share``): a span of the window copied again further on, as
  a file repeats its identifiers and lines.

The induction gate (:mod:`svt.models.induction`) is measured every ``gate_every`` steps and its curve
written to ``WORK/curve.json``; a checkpoint (model, optimiser, data position, curve) is written
every ``checkpoint_minutes`` and at the end, and a run started again with the same WORK resumes
from it. The phase stops at ``max_tokens``, or earlier when the gate passes ``patience`` times in a
row (``stop_on_gate``) or ``after_jump_tokens`` after the best head first scores ``jump_score``
(the phase change). The learning rate warms up, then stays constant or decays (cosine) to
``final_lr_share`` of its peak; with a ``teacher`` the phase distils it instead of fitting the text.

    python -m svt.models.induction_phase --work build/tiny/induction --batch 8 --context 64

``--trial`` measures training tokens per second for a few (B, C) shapes instead (the per-step
overhead of small batches decides which is cheapest per token). The whole recipe of the built-in
pair runs several such phases in turn (:mod:`svt.models.recipe`).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from svt.models.induction import induction_gate, passes


@dataclass
class PhaseConfig:
    batch: int = 8
    context: int = 64
    lr: float = 2e-3
    warmup: int = 200
    random_share: float = 0.25  # windows holding a random-token string written twice
    copy_share: float = 0.25  # windows repeating a span of their own text
    min_span: int = 4
    max_span: int | None = None  # the longest repeated span (None: half the window)
    gate_every: int = 250
    patience: int = 2  # the gate must pass this many measurements in a row
    max_tokens: int = 16_000_000
    checkpoint_minutes: float = 10.0
    seed: int = 0
    final_lr_share: float = 1.0  # 1: constant after warm-up; < 1: cosine decay to this share of lr
    stop_on_gate: bool = True  # stop once the gate passes `patience` times in a row
    confidence_weight: float = 0.0  # distillation only: token weight = teacher's top-1 prob ** this
    jump_score: float = 0.0  # > 0: the phase ends `after_jump_tokens` after the best head first scores this
    after_jump_tokens: int = 0


def window_batch(stream: np.ndarray, cfg: PhaseConfig, rng: np.random.Generator, vocab: int) -> torch.Tensor:
    """``cfg.batch`` windows of ``cfg.context + 1`` tokens, some holding a repeated span."""
    n = cfg.context + 1
    starts = rng.integers(0, len(stream) - n, size=cfg.batch)
    x = np.stack([stream[s : s + n] for s in starts]).copy()
    kind = rng.random(cfg.batch)
    for b in range(cfg.batch):
        if kind[b] >= cfg.random_share + cfg.copy_share:
            continue
        span = int(rng.integers(cfg.min_span, min(n // 2, cfg.max_span or n) + 1))
        at = int(rng.integers(0, n - 2 * span + 1))
        gap = int(rng.integers(0, n - 2 * span - at + 1))  # the copy starts anywhere after the span
        src = rng.integers(1, vocab, size=span) if kind[b] < cfg.random_share else x[b, at : at + span].copy()
        x[b, at : at + span] = src
        x[b, at + span + gap : at + 2 * span + gap] = src
    return torch.from_numpy(x)


def lr_at(step: int, cfg: PhaseConfig, max_steps: int) -> float:
    """Linear warm-up, then constant (``final_lr_share`` 1) or a cosine decay to ``final_lr_share``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, max_steps - cfg.warmup)
    return cfg.lr * (cfg.final_lr_share + (1 - cfg.final_lr_share) * 0.5 * (1 + math.cos(math.pi * frac)))


def train_step(model, opt, batch: torch.Tensor, teacher=None, confidence_weight: float = 0.0) -> torch.Tensor:
    """One step on ``batch`` (clipped at norm 1); the loss. Next-token cross-entropy, or with a
    ``teacher`` the soft cross-entropy against its distributions (KL(teacher || model) + const),
    each token weighted by the teacher's top-1 probability ** ``confidence_weight``."""
    x = batch[:, :-1]
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):  # float32 on a CPU
        logits = model(input_ids=x).logits.float()
    if teacher is None:
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    else:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):
            target_probs = teacher(input_ids=x).logits.float().softmax(-1)
        per_token = -(target_probs * logits.log_softmax(-1)).sum(-1)
        weight = target_probs.amax(-1) ** confidence_weight
        loss = (per_token * weight).sum() / weight.sum()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def _checkpoint(work: Path, model, opt, step: int, rng: np.random.Generator, curve: list, cfg: PhaseConfig) -> None:
    tmp = work / "checkpoint.pt.tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                "rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(), "curve": curve,
                "config": asdict(cfg)}, tmp)
    tmp.replace(work / "checkpoint.pt")


def run_phase(model, stream: np.ndarray, cfg: PhaseConfig, work: Path, *, vocab: int, bos: int,
              teacher=None, log=print) -> dict:
    """Train ``model`` in place until the gate passes (if ``cfg.stop_on_gate``) or ``max_tokens``;
    resumes from WORK's checkpoint. With a ``teacher``, distils it (see :func:`train_step`)."""
    work.mkdir(parents=True, exist_ok=True)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1, betas=(0.9, 0.95))
    rng = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)
    step, curve = 0, []
    ckpt = work / "checkpoint.pt"
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        if state["config"] != asdict(cfg):
            raise SystemExit(f"{ckpt} was made with another phase config; remove {work} or use the same options.")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
        step, curve = state["step"], state["curve"]
        log(f"resumed at step {step} ({step * cfg.batch * cfg.context:,} tokens)")
    max_steps = cfg.max_tokens // (cfg.batch * cfg.context)
    device = next(model.parameters()).device
    model.train()
    t0, last_ckpt, streak = time.time(), time.time(), 0
    jumped = next((c for c in curve if cfg.jump_score > 0 and c.get("max_induction_score", 0) >= cfg.jump_score), None)
    while step < max_steps:
        lr = lr_at(step, cfg, max_steps)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = train_step(model, opt, window_batch(stream, cfg, rng, vocab).to(device), teacher,
                          cfg.confidence_weight)
        step += 1
        if step % cfg.gate_every == 0 or step == max_steps:
            gate = induction_gate(model, vocab=vocab, bos=bos)
            tokens = step * cfg.batch * cfg.context
            curve.append({"step": step, "tokens": tokens, "lr": lr, "loss": round(loss.item(), 4),
                          "seconds": round(time.time() - t0, 1), **gate})
            (work / "curve.json").write_text(json.dumps({"config": asdict(cfg), "curve": curve}, indent=1) + "\n")
            log(f"step {step} tokens {tokens:,} loss {loss.item():.3f} gate top1 {gate['top1']:.3f} "
                f"ce {gate['cross_entropy']:.2f} max head {gate.get('max_induction_score', 0):.3f} "
                f"({tokens / max(time.time() - t0, 1e-9):,.0f} tok/s this session)", flush=True)
            streak = streak + 1 if passes(gate) else 0
            if cfg.stop_on_gate and streak >= cfg.patience:
                break
            if jumped is None and cfg.jump_score > 0 and gate.get("max_induction_score", 0) >= cfg.jump_score:
                jumped = curve[-1]
                log(f"the best head scored {gate['max_induction_score']:.3f} >= {cfg.jump_score} at {tokens:,} "
                    f"tokens: {cfg.after_jump_tokens:,} more", flush=True)
            if jumped is not None and tokens >= jumped["tokens"] + cfg.after_jump_tokens:
                break
        if time.time() - last_ckpt > 60 * cfg.checkpoint_minutes:
            _checkpoint(work, model, opt, step, rng, curve, cfg)
            last_ckpt = time.time()
    _checkpoint(work, model, opt, step, rng, curve, cfg)
    passed = [c for c in curve if passes(c)]
    return {"config": asdict(cfg), "steps": step, "tokens": step * cfg.batch * cfg.context,
            "passed": streak >= cfg.patience, "first_pass_tokens": passed[0]["tokens"] if passed else None,
            "jump_tokens": jumped["tokens"] if jumped else None, "jump_step": jumped["step"] if jumped else None,
            "seconds": round(time.time() - t0, 1), "curve": curve}


def trial(model_factory, stream: np.ndarray, shapes: list[tuple[int, int]], steps: int, vocab: int) -> list[dict]:
    """Training tokens per second of each (B, C), ``steps`` steps after 3 warm-up steps."""
    out = []
    for b, c in shapes:
        model = model_factory()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        cfg = PhaseConfig(batch=b, context=c)
        rng = np.random.default_rng(0)
        for i in range(steps + 3):
            if i == 3:
                t0 = time.perf_counter()
            train_step(model, opt, window_batch(stream, cfg, rng, vocab))
        dt = time.perf_counter() - t0
        out.append({"batch": b, "context": c, "tokens_per_step": b * c, "steps_per_s": round(steps / dt, 2),
                    "tokens_per_s": round(steps * b * c / dt)})
        print(out[-1], flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    from svt.models.train_tiny import EOS, TARGET, make_model, prepare_data

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("build/tiny/induction"))
    ap.add_argument("--batch", type=int, default=PhaseConfig.batch)
    ap.add_argument("--context", type=int, default=PhaseConfig.context)
    ap.add_argument("--max-tokens", type=int, default=PhaseConfig.max_tokens)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trial", action="store_true", help="measure tokens/s for a few (B, C) and stop")
    args = ap.parse_args(argv)
    if args.batch < 1 or args.context < 2 * PhaseConfig.min_span or args.max_tokens < 1 or args.threads < 1:
        ap.error(f"--batch, --max-tokens and --threads must be >= 1 and --context >= {2 * PhaseConfig.min_span}.")
    torch.set_num_threads(args.threads)
    tok, stream, _, _ = prepare_data(args.seed)
    eos = tok.token_to_id(EOS)
    vocab = tok.get_vocab_size()

    def factory():
        torch.manual_seed(args.seed)
        return make_model(TARGET, eos)

    if args.trial:
        result = trial(factory, stream, [(2, 128), (4, 64), (8, 32), (8, 64), (16, 32), (8, 128)], 30, vocab)
        args.work.mkdir(parents=True, exist_ok=True)
        (args.work / "trial.json").write_text(json.dumps(result, indent=1) + "\n")
        return
    cfg = PhaseConfig(batch=args.batch, context=args.context, max_tokens=args.max_tokens, seed=args.seed)
    model = factory()
    result = run_phase(model, stream, cfg, args.work, vocab=vocab, bos=eos)
    (args.work / "phase.json").write_text(json.dumps({k: v for k, v in result.items() if k != "curve"},
                                                     indent=1) + "\n")
    model.save_pretrained(args.work / "target-phase1")
    print(f"phase 1: {'gate passed' if result['passed'] else 'gate NOT passed'} after {result['tokens']:,} tokens")


if __name__ == "__main__":
    main()
