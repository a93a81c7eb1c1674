"""The target's last stage: sequence-level unlikelihood against repeating its own output.

A model trained by likelihood alone degenerates under greedy decoding: it repeats itself, and a
loop reinforces itself (Welleck et al., "Neural Text Generation with Unlikelihood Training",
ICLR 2020; Xu et al., "Learning to Break the Loop", NeurIPS 2022). The built-in target copies from
its context on purpose (edit, toolcalls and agent-log prompts want it), and so it also copies its
own loops. This stage fine-tunes it as Welleck et al.'s sequence-level unlikelihood does:

- each step, the model greedily continues ``batch`` training-stream prompts (its current weights);
- a continuation token is a *candidate* when the n-gram it completes already stands in the
  continuation before it at least as often as in the prompt (:func:`repeat_mask`): repeating one's
  own output is penalised, copying from the prompt is not, and a line the prompt holds twice may be
  written twice;
- the loss is ``-log(1 - p(candidate))`` summed over the candidates, divided by the continuation's
  length, plus the next-token likelihood on windows of the training stream (with the recipe's
  repeated spans, so the induction circuit keeps its training signal).

Every ``eval_every`` steps the stage measures the held-out loss, the induction gate and how often
the next 8 greedy tokens of held-out prompts already stand in the model's own output; it keeps the
least repetitive measured weights whose held-out loss and gate stay within the limits, and refuses
itself (the model keeps its weights from before the stage) when none does. Checkpoints every few
minutes; a run started again with the same WORK resumes.

    python -m svt.models.unlikelihood --target data/models/target --out data/models --work build/tiny
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch

from svt.metrics.repetition import repeated_share
from svt.models.induction import induction_gate
from svt.models.induction_phase import PhaseConfig, window_batch


@dataclass
class UnlikelihoodConfig:
    steps: int = 300
    batch: int = 8  # continuations per step
    prompt_len: int = 128
    new_tokens: int = 128
    # the n-gram a candidate completes: 12 penalises loops, not the short patterns code repeats (with 6,
    # the held-out loss rose by 0.19 and the gate fell by 0.13 in 100 steps; with 12 and half the
    # weight the stage stays within both limits: trials in data/models/README.md)
    ngram: int = 12
    free_repeats: int = 1  # see repeat_mask
    ul_weight: float = 0.5
    token_weight: float = 0.0  # token-level unlikelihood on the likelihood windows (previous tokens, not gold)
    ditto_weight: float = 0.0  # DITTO's pseudo-repetition loss (Xu et al. 2022) instead of, or beside, the above
    ditto_lambda: float = 0.5  # each repetition's probability pushed towards lambda x the previous one's
    ditto_first: int = 2  # the first repetition penalised (0-based: 2 leaves the first copy free)
    # the likelihood windows as the target's last stage (``target-context``) draws them: with a
    # shorter context or longer repeated spans the induction gate falls by 0.2 in 100 steps of
    # likelihood alone (measured), so the stage would unlearn copying whatever its penalty does
    mle_batch: int = 8
    mle_context: int = 512
    random_share: float = 0.3
    copy_share: float = 0.1
    max_span: int = 64
    lr: float = 5e-5
    warmup: int = 50
    final_lr_share: float = 0.1
    eval_every: int = 50
    eval_prompts: int = 32
    max_held_out_loss: float = 2.45  # nats/token: the stage must not cost more than this
    max_gate_top1_drop: float = 0.02  # the induction gate's top-1 may fall this much at most
    checkpoint_minutes: float = 5.0
    seed: int = 10


def repeat_mask(prompt: np.ndarray | list, output: np.ndarray | list, n: int, free: int = 1) -> np.ndarray:
    """Per output position t: whether ``output[t-n+1 : t+1]`` (an n-gram wholly in the output)
    already ended earlier in the output at least ``max(free, its count in the prompt)`` times. The
    unlikelihood candidates of a continuation: ``free`` = 1 penalises the first repeat of one's own
    output; 2 lets a stretch of output be written twice (as the prompt's one copy may be copied
    once: the model cannot tell where its prompt ended, so a rule that treats the two alike can be
    learnt without unlearning copying).

    >>> repeat_mask([], [1, 2, 1, 2, 1], 2).tolist()
    [False, False, False, True, True]
    >>> repeat_mask([1, 2], [1, 2, 1, 2], 2).tolist()   # the prompt holds (1, 2) once: the 2nd copy repeats
    [False, False, False, True]
    >>> repeat_mask([], [1, 2, 1, 2, 1, 2], 2, free=2).tolist()
    [False, False, False, False, False, True]
    """
    out = [int(x) for x in output]
    in_prompt = Counter(tuple(int(x) for x in prompt[i : i + n]) for i in range(max(0, len(prompt) - n + 1)))
    seen: Counter = Counter()
    mask = np.zeros(len(out), dtype=bool)
    for t in range(n - 1, len(out)):
        g = tuple(out[t - n + 1 : t + 1])
        mask[t] = seen[g] >= max(free, in_prompt[g])
        seen[g] += 1
    return mask


def unlikelihood_loss(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``-sum log(1 - p(token))`` over the masked positions, divided by the positions given.
    ``logits[:, t]`` is the distribution that produced ``tokens[:, t]``."""
    logp = logits.float().log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    # log(1 - p) from log p, stable as p -> 1 (the loop tokens the stage exists for)
    one_minus = torch.log(-torch.expm1(logp.clamp(max=-1e-6)))
    return -(one_minus * mask).sum() / mask.numel()


@torch.no_grad()
def greedy(model, prompts: torch.Tensor, new_tokens: int, eos: int) -> torch.Tensor:
    """The model's greedy continuations (``new_tokens`` each, no early stop)."""
    was = model.training
    model.eval()
    prompts = prompts.to(next(model.parameters()).device)
    out = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=new_tokens,
                         min_new_tokens=new_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
                         pad_token_id=eos, eos_token_id=None)
    model.train(was)
    return out[:, prompts.shape[1]:].cpu()


def self_repetition(model, prompts: torch.Tensor, new_tokens: int, eos: int, n: int = 8) -> float:
    """Share of greedy output positions whose next ``n`` tokens already stand in the output before
    them (the loops; ``svt.metrics.repetition.repeated_share``'s output-only count)."""
    outs = greedy(model, prompts, new_tokens, eos)
    pos = hit = 0
    for p, o in zip(prompts.numpy(), outs.numpy(), strict=True):
        a, _, c = repeated_share(p, o, n)
        pos, hit = pos + a, hit + c
    return hit / max(pos, 1)


def ul_step(model, opt, stream: np.ndarray, cfg: UnlikelihoodConfig, rng: np.random.Generator, vocab: int,
            eos: int) -> dict:
    """One update: unlikelihood on the model's own greedy continuations + likelihood on the stream."""
    starts = rng.integers(0, len(stream) - cfg.prompt_len, size=cfg.batch)
    prompts = torch.from_numpy(np.stack([stream[s : s + cfg.prompt_len] for s in starts]).astype(np.int64))
    cont = greedy(model, prompts, cfg.new_tokens, eos)
    mask = torch.from_numpy(np.stack([repeat_mask(p, o, cfg.ngram, cfg.free_repeats) for p, o in
                                      zip(prompts.numpy(), cont.numpy(), strict=True)]))
    device = next(model.parameters()).device
    seq = torch.cat([prompts, cont], 1).to(device)
    logits = model(input_ids=seq[:, :-1]).logits[:, cfg.prompt_len - 1:]
    ul = unlikelihood_loss(logits, cont.to(device), mask.float().to(device))
    mle_cfg = PhaseConfig(batch=cfg.mle_batch, context=cfg.mle_context, random_share=cfg.random_share,
                          copy_share=cfg.copy_share, max_span=cfg.max_span)
    opt.zero_grad(set_to_none=True)
    (cfg.ul_weight * ul).backward()
    # the likelihood gradient is added to the unlikelihood one already accumulated
    if cfg.ditto_weight > 0:
        rows, spans = ditto_batch(stream, cfg.batch, cfg.prompt_len + cfg.new_tokens, rng)
        rows = rows.to(device)
        dl = ditto_loss(model(input_ids=rows[:, :-1]).logits, rows, spans, cfg.ditto_lambda, cfg.ditto_first)
        (cfg.ditto_weight * dl).backward()
    mle = _accumulating_step(model, opt, window_batch(stream, mle_cfg, rng, vocab).to(device), cfg.token_weight)
    return {"ul": ul.item(), "mle": mle.item(), "candidates": mask.float().mean().item()}


def previous_token_candidates(batch: torch.Tensor, vocab: int) -> torch.Tensor:
    """Token-level unlikelihood candidates (Welleck et al.): ``[B, T - 1, V]``, true for every token
    that stands in ``batch[:, :t + 1]`` (the context of prediction t) except the gold next token
    ``batch[:, t + 1]``. Copying stays free: a copied token is the gold one."""
    x, y = batch[:, :-1], batch[:, 1:]
    seen = torch.zeros((*x.shape, vocab), dtype=torch.bool, device=batch.device)
    seen.scatter_(2, x.unsqueeze(-1), True)
    seen = seen.cummax(1).values
    seen.scatter_(2, y.unsqueeze(-1), False)
    return seen


def ditto_batch(stream: np.ndarray, batch: int, length: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """DITTO's pseudo-repetitive rows: a span of 8-32 training-stream tokens repeated to fill
    ``length`` tokens; returns the rows and each row's span length."""
    spans = rng.integers(8, 33, size=batch)
    rows = []
    for m in spans:
        s = int(rng.integers(0, len(stream) - m))
        rows.append(np.resize(stream[s : s + m], length))
    return torch.from_numpy(np.stack(rows).astype(np.int64)), torch.from_numpy(spans.astype(np.int64))


def ditto_loss(logits: torch.Tensor, rows: torch.Tensor, spans: torch.Tensor, lam: float, first: int) -> torch.Tensor:
    """``-log(1 - |p_r - lam * p_{r-1}|)`` over the tokens of repetitions ``r >= first``, where
    ``p_r`` is the probability of a token in repetition r and ``p_{r-1}`` (no gradient) that of the
    same token one repetition earlier. ``logits[:, t]`` predicts ``rows[:, t + 1]``."""
    p = logits.float().softmax(-1).gather(-1, rows[:, 1:].unsqueeze(-1)).squeeze(-1)  # [B, T]
    T = p.shape[1]
    t = torch.arange(T, device=p.device)[None, :]
    m = spans[:, None].to(p.device)
    prev = (t - m).clamp(min=0)
    rep = (t + 1) // m  # the repetition the predicted token belongs to
    mask = (rep >= first) & (t - m >= 0)
    target = lam * p.gather(1, prev).detach()
    loss = -torch.log((1 - (p - target).abs()).clamp(min=1e-6))
    return (loss * mask).sum() / mask.sum().clamp(min=1)


def _accumulating_step(model, opt, batch: torch.Tensor, token_weight: float = 0.0) -> torch.Tensor:
    import torch.nn.functional as F

    x = batch[:, :-1]
    logits = model(input_ids=x).logits.float()
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    if token_weight > 0:
        cand = previous_token_candidates(batch, logits.shape[-1])
        p = logits.softmax(-1)
        loss = loss - token_weight * (torch.log((1 - p).clamp(min=1e-6)) * cand).sum(-1).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def lr_at(step: int, cfg: UnlikelihoodConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.final_lr_share + (1 - cfg.final_lr_share) * 0.5 * (1 + math.cos(math.pi * frac)))


def measure(model, held: torch.Tensor, cfg: UnlikelihoodConfig, vocab: int, eos: int) -> dict:
    """Held-out loss, the induction gate, and greedy self-repetition on held-out prompts."""
    from svt.models.train_tiny import evaluate

    gate = induction_gate(model, vocab=vocab, bos=eos)
    prompts = held[: cfg.eval_prompts, : cfg.prompt_len].long()
    return {"held_out_loss": round(evaluate(model, None, held)["held_out_loss"], 4),
            "gate_top1": round(gate["top1"], 4), "gate_cross_entropy": round(gate["cross_entropy"], 3),
            "self_repetition": round(self_repetition(model, prompts, cfg.new_tokens, eos), 4)}


def admissible(m: dict, before: dict, cfg: UnlikelihoodConfig) -> bool:
    """Whether measured weights keep the held-out loss and the induction gate within the limits."""
    return m["held_out_loss"] <= cfg.max_held_out_loss and m["gate_top1"] >= before["gate_top1"] - cfg.max_gate_top1_drop


def _checkpoint(work: Path, model, opt, step: int, rng, curve: list, best, cfg: UnlikelihoodConfig) -> None:
    tmp = work / "checkpoint.pt.tmp"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "rng": rng.bit_generator.state,
                "torch_rng": torch.get_rng_state(), "curve": curve, "best": best, "config": asdict(cfg)}, tmp)
    tmp.replace(work / "checkpoint.pt")


def run_stage(model, stream: np.ndarray, held: torch.Tensor, cfg: UnlikelihoodConfig, work: Path, *, vocab: int,
              eos: int, log=print) -> dict:
    """Fine-tune ``model`` in place; on return it holds the chosen weights (the best admissible
    measurement, or its weights from before the stage when none is admissible). Resumes from WORK."""
    work.mkdir(parents=True, exist_ok=True)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.1, betas=(0.9, 0.95))
    rng = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)
    ckpt = work / "checkpoint.pt"
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        if state["config"] != asdict(cfg):
            raise SystemExit(f"{ckpt} was made with another stage config; remove {work} or use the same options.")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
        step, curve, best = state["step"], state["curve"], state["best"]
        log(f"[unlikelihood] resumed at step {step}", flush=True)
    else:
        before = {"step": 0, **measure(model, held, cfg, vocab, eos)}
        step, curve = 0, [before]
        best = {"step": 0, "state": copy.deepcopy(model.state_dict()), "measure": before}
        log(f"[unlikelihood] before: {before}", flush=True)
    before = curve[0]
    model.train()
    t0, last = time.time(), time.time()
    while step < cfg.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        losses = ul_step(model, opt, stream, cfg, rng, vocab, eos)
        step += 1
        if step % cfg.eval_every == 0 or step == cfg.steps:
            m = {"step": step, **measure(model, held, cfg, vocab, eos), **{k: round(v, 4) for k, v in losses.items()},
                 "seconds": round(time.time() - t0, 1)}
            curve.append(m)
            ok = admissible(m, before, cfg)
            if ok and m["self_repetition"] < best["measure"]["self_repetition"]:
                best = {"step": step, "state": copy.deepcopy(model.state_dict()), "measure": m}
            (work / "curve.json").write_text(json.dumps({"config": asdict(cfg), "curve": curve}, indent=1) + "\n")
            log(f"[unlikelihood] {m} {'admissible' if ok else 'NOT admissible'}", flush=True)
        if time.time() - last > 60 * cfg.checkpoint_minutes:
            _checkpoint(work, model, opt, step, rng, curve, best, cfg)
            last = time.time()
    _checkpoint(work, model, opt, step, rng, curve, best, cfg)
    model.load_state_dict(best["state"])
    accepted = best["step"] > 0
    return {"stage": "target-unlikelihood", "config": asdict(cfg), "steps": step, "accepted": accepted,
            "chosen_step": best["step"], "before": before, "after": best["measure"], "curve": curve,
            "seconds_this_session": round(time.time() - t0, 1)}


def overrides(pairs: list[str]) -> dict:
    """``FIELD=VALUE`` strings as typed config fields."""
    types = {f.name: f.type for f in fields(UnlikelihoodConfig) if f.name != "steps"}  # (--steps sets it)
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in types or not value:
            raise SystemExit(f"--set {pair!r}: FIELD=VALUE with FIELD one of {', '.join(types)}.")
        try:
            out[key] = {"int": int, "float": float}[str(types[key])](value)
        except ValueError:
            raise SystemExit(f"--set {pair!r}: {value!r} is not a {types[key]}.") from None
    return out


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--target", type=Path, default=Path("data/models/target"),
                    help="the committed target to fine-tune (its sharpening is undone first)")
    ap.add_argument("--out", type=Path, default=Path("data/models"))
    ap.add_argument("--work", type=Path, default=Path("build/tiny"))
    ap.add_argument("--steps", type=int, default=UnlikelihoodConfig.steps)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a stage setting (e.g. --set lr=1e-4 --set ngram=8); trials")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--trial", action="store_true", help="measure only: never write the target")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.threads < 1:
        ap.error("--steps and --threads must be >= 1.")
    # every argument checked before any work (the data preparation alone takes half a minute)
    args.overrides = overrides(args.set)
    if not (args.target / "model.safetensors").is_file():
        raise SystemExit(f"--target {args.target}: no model.safetensors there.")
    return args


def main(argv: list[str] | None = None) -> None:
    """Fine-tune a saved target and write it back (sharpened, bf16) when the stage is accepted."""
    from transformers import AutoModelForCausalLM

    from svt.models.loading import weights_hash
    from svt.models.train_tiny import EOS, prepare_data, save_target

    args = _parse(argv)
    torch.set_num_threads(args.threads)
    try:
        training = json.loads((args.out / "training.json").read_text())
        factor, seed = float(training["models"]["target"]["sharpen"]), int(training["seed"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise SystemExit(f"{args.out}/training.json: not the pair's training record ({exc}).") from None
    source_id = weights_hash(args.target)
    tok, stream, held, _ = prepare_data(seed)
    eos, vocab = tok.token_to_id(EOS), tok.get_vocab_size()
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.div_(factor)  # as trained: the stage trains the unsharpened model
    cfg = UnlikelihoodConfig(steps=args.steps, **args.overrides)
    tag = hashlib.sha256(json.dumps(asdict(cfg), sort_keys=True).encode()).hexdigest()[:8]
    result = run_stage(model, stream, held, cfg, args.work / f"target-unlikelihood-{source_id}-{tag}", vocab=vocab,
                       eos=eos)
    result["from_target_sha256_16"] = source_id
    print(f"[unlikelihood] {'accepted' if result['accepted'] else 'REFUSED'}: before {result['before']}, "
          f"after (step {result['chosen_step']}) {result['after']}", flush=True)
    if args.trial:
        return
    if not result["accepted"]:
        raise SystemExit("the stage is refused: no measured weights kept the held-out loss and the induction gate "
                         f"within the limits while repeating less; {args.target} is unchanged.")
    save_target(args.out, model, factor, result, held)


if __name__ == "__main__":
    main()
