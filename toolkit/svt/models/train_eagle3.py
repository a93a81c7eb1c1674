"""Train the built-in hidden-state heads on the frozen built-in target (stages of ``make models``):
the EAGLE-3 head (``--kind eagle3``) and the MTP head (``--kind mtp``, DeepSeek-V3's form).

As EAGLE-3 trains its heads: the target is frozen; its three tapped hidden states are fused by the
head; "training-time test" unrolls ``ttt_steps`` draft steps, each step fed its own previous output
feature (:meth:`svt.models.eagle3.Eagle3Head.ttt`); the loss is the soft cross-entropy against the
target's own next-token distribution (the sharpened target, temperature 1), step ``k`` weighted
``0.8 ** k``. The data: windows of the training stream (the same one the target was trained on:
standard-library training files and task documents, never the held-out files the workloads come
from) and, for ``generated_share`` of the windows, text the target itself generated from
training-stream prompts (half sampled at temperature 1, half greedy), as SpecForge recommends.

The head starts from the target where shapes agree: its LM head and final norm are the target's
(the head's logits start on the target's scale), the embedding is the target's (shared, frozen,
not saved: the published form for a head without ``embed_tokens``).

Checkpoints every ``checkpoint_minutes`` in ``WORK`` and resumes from them; the per-step accuracy
curve and the final figures go to ``OUT/training.json`` under ``models.eagle3`` (written beside,
then swapped). ::

    python -m svt.models.train_eagle3 --target data/models/target --out data/models --work build/tiny/eagle3

The head reads the target's features: retrain it whenever the target changes (``make models`` runs
this stage after the target's).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from svt.models.eagle3 import Eagle3Config, Eagle3Head, save_head


@dataclass(frozen=True)
class HeadTraining:
    tokens: int = 3_600_000  # window tokens seen (each unrolled ttt_steps deep)
    batch: int = 8
    context: int = 256
    ttt_steps: int = 6
    step_decay: float = 0.8
    lr: float = 2e-3
    warmup: int = 50
    final_lr_share: float = 0.05
    generated_share: float = 0.5
    generated_sequences: int = 2048  # target continuations, each prompt_len + new_tokens long
    prompt_len: int = 64
    seed: int = 0
    eval_every: int = 100
    checkpoint_minutes: float = 5.0


def cosine_lr(step: int, n: int, cfg) -> float:
    """A linear warm-up over ``cfg.warmup`` steps, then a cosine decay to ``cfg.final_lr_share`` of
    ``cfg.lr`` (the heads' and the block drafters' schedule)."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, n - cfg.warmup)
    lo = cfg.final_lr_share
    return cfg.lr * (lo + (1 - lo) * 0.5 * (1 + math.cos(math.pi * frac)))


def target_view(target, ids: torch.Tensor, aux: tuple[int, ...]):
    """The frozen target on ``ids`` [B, n]: concatenated taps [B, n, 3H] and logits [B, n, V]."""
    out = target(input_ids=ids, output_hidden_states=True)
    taps = torch.cat([out.hidden_states[k] for k in aux], -1)
    return taps, out.logits.float()


def ttt_loss(head: Eagle3Head, ids: torch.Tensor, taps: torch.Tensor, logits: torch.Tensor, steps: int,
             decay: float) -> tuple[torch.Tensor, list[float], list[float]]:
    """Weighted soft cross-entropy of the unrolled head; per-step loss and top-1 agreement."""
    n = ids.shape[1]
    outs = head.ttt(ids, head.fuse(taps), steps)
    L = n - 1
    total, losses, accs, wsum = 0.0, [], [], 0.0
    for k, o in enumerate(outs):
        valid = L - k  # chain i predicts the target's distribution at position i + 1 + k < n
        if valid <= 0:
            break
        p = logits[:, 1 + k : 1 + k + valid].softmax(-1)
        logq = o.logits[:, :valid].float().log_softmax(-1)
        ce = -(p * logq.clamp(min=-1e4)).sum(-1).mean()
        w = decay ** k
        total = total + w * ce
        wsum += w
        losses.append(float(ce.detach()))
        accs.append(float((o.logits[:, :valid].argmax(-1) == logits[:, 1 + k : 1 + k + valid].argmax(-1))
                          .float().mean()))
    return total / wsum, losses, accs


def make_head(target, aux: tuple[int, ...] = (1, 2, 3), intermediate: int | None = None) -> Eagle3Head:
    """A head shaped for ``target``, sharing its embedding, LM head and final norm copied in."""
    tc = target.config
    cfg = Eagle3Config(hidden_size=tc.hidden_size, intermediate_size=intermediate or tc.intermediate_size,
                       num_attention_heads=tc.num_attention_heads, num_key_value_heads=tc.num_key_value_heads,
                       vocab_size=tc.vocab_size, draft_vocab_size=tc.vocab_size, target_hidden_size=tc.hidden_size,
                       aux_layer_ids=tuple(aux), rms_norm_eps=tc.rms_norm_eps,
                       rope_theta=float((getattr(tc, "rope_parameters", None) or {}).get("rope_theta", 10000.0)),
                       max_position_embeddings=tc.max_position_embeddings,
                       bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id,
                       pad_token_id=tc.pad_token_id if tc.pad_token_id is not None else tc.eos_token_id)
    head = Eagle3Head(cfg, embed=target.get_input_embeddings())
    with torch.no_grad():
        head.lm_head.weight.copy_(target.get_output_embeddings().weight)
        head.norm.weight.copy_(target.model.norm.weight)
    head.embed_tokens.weight.requires_grad_(False)
    return head


def make_mtp_head(target, intermediate: int | None = None):
    """An MTP head (DeepSeek-V3's form) for ``target``: it reads the target's final hidden state
    (tap ``L``), shares its embedding and output head; its final norm starts as the target's."""
    from svt.models.mtp import MTPHead

    tc = target.config
    base = make_head(target, intermediate=intermediate).cfg
    cfg = Eagle3Config(**{**base.__dict__, "aux_layer_ids": (int(tc.num_hidden_layers),)})
    head = MTPHead(cfg, target.get_input_embeddings(), target.get_output_embeddings())
    with torch.no_grad():
        head.shared_head.norm.weight.copy_(target.model.norm.weight)
    for p in (*head.embed_tokens.parameters(), *head.shared_head.head.parameters()):
        p.requires_grad_(False)
    return head


KINDS = {"eagle3": make_head, "mtp": make_mtp_head}
#: window tokens per kind: the MTP head gets under a quarter of EAGLE-3's (a session's CPU time, not a finding)
TOKENS = {"eagle3": 3_600_000, "mtp": 800_000}


@torch.no_grad()
def generate_continuations(target, stream: np.ndarray, cfg: HeadTraining, eos: int, log=print) -> np.ndarray:
    """``generated_sequences`` rows of ``context`` tokens: a training-stream prompt of ``prompt_len``
    tokens and the target's own continuation (even rows sampled at T = 1, odd rows greedy)."""
    rng = np.random.default_rng(cfg.seed + 100)
    new = cfg.context - cfg.prompt_len
    rows = []
    t0 = time.time()
    for start in range(0, cfg.generated_sequences, 32):
        nb = min(32, cfg.generated_sequences - start)
        s = rng.integers(0, len(stream) - cfg.prompt_len, size=nb)
        prompts = torch.from_numpy(np.stack([stream[i : i + cfg.prompt_len] for i in s]))
        for greedy in (False, True):
            half = prompts[int(greedy)::2]
            if not len(half):
                continue
            torch.manual_seed(cfg.seed + start + int(greedy))
            out = target.generate(half, attention_mask=torch.ones_like(half), max_new_tokens=new, min_new_tokens=new,
                                  do_sample=not greedy, temperature=1.0 if not greedy else None, top_p=None,
                                  top_k=None, pad_token_id=eos, eos_token_id=None)
            rows.append(out[:, : cfg.context].numpy())
        log(f"[heads] generated {start + nb}/{cfg.generated_sequences} continuations "
            f"({time.time() - t0:.0f} s)", flush=True)
    return np.concatenate(rows)


def sample_windows(stream, generated, cfg: HeadTraining, rng) -> torch.Tensor:
    n_gen = int(rng.binomial(cfg.batch, cfg.generated_share)) if len(generated) else 0
    rows = [generated[i] for i in rng.integers(0, len(generated), size=n_gen)] if n_gen else []
    starts = rng.integers(0, len(stream) - cfg.context, size=cfg.batch - n_gen)
    rows += [stream[s : s + cfg.context] for s in starts]
    return torch.from_numpy(np.stack(rows).astype(np.int64))


@torch.no_grad()
def evaluate_head(head, target, held: torch.Tensor, cfg: HeadTraining) -> dict:
    """Per-step soft cross-entropy and top-1 agreement with the target on held-out windows."""
    losses, accs = [], []
    for chunk in held.split(cfg.batch):
        taps, logits = target_view(target, chunk, head.cfg.aux_layer_ids)
        _, lo, ac = ttt_loss(head, chunk, taps, logits, cfg.ttt_steps, cfg.step_decay)
        losses.append(lo)
        accs.append(ac)
    return {"held_out_ce_by_step": [round(float(x), 4) for x in np.mean(losses, 0)],
            "held_out_top1_by_step": [round(float(x), 4) for x in np.mean(accs, 0)]}


def _save_checkpoint(work: Path, head, opt, step: int, curve: list, rng) -> None:
    tmp = work / "checkpoint.pt.tmp"
    torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "curve": curve,
                "rng": rng.bit_generator.state}, tmp)
    tmp.replace(work / "checkpoint.pt")


def trained_part(head) -> dict[str, torch.Tensor]:
    """The head's own weights: its state less the target's shared (frozen) embedding."""
    shared = {n for n, p in head.named_parameters() if not p.requires_grad}
    return {n: t for n, t in head.state_dict().items() if n not in shared}


def _start_from(head, init: tuple[str, dict], kind: str) -> None:
    """Load ``init`` = (name, a head's own weights) into ``head``; one message if it does not fit."""
    try:
        missing, unexpected = head.load_state_dict(init[1], strict=False)
    except RuntimeError as exc:  # a weight of another shape
        raise SystemExit(f"--init-from {init[0]}: not a {kind} head of this shape "
                         f"({str(exc).strip().splitlines()[-1].strip()}).") from None
    own = set(trained_part(head))
    if unexpected or own & set(missing):
        raise SystemExit(f"--init-from {init[0]}: not a {kind} head of this shape (missing "
                         f"{sorted(own & set(missing))[:3]}, unexpected {sorted(unexpected)[:3]}).")


def train_head(target, stream: np.ndarray, held: torch.Tensor, cfg: HeadTraining, work: Path, *, eos: int,
               target_id: str = "", kind: str = "eagle3", init: tuple[str, dict] | None = None,
               log=print) -> tuple[Eagle3Head, dict]:
    """The whole stage: continuations (cached in WORK), the TTT loop (checkpointed), the figures.
    ``target_id`` (the target's weights hash) keys the work folder: a checkpoint or continuations
    made on another target are never resumed. ``init`` = (its name, a head's own weights): start
    from them instead of at random (a head trained on an earlier target, fine-tuned to a new one)."""
    work.mkdir(parents=True, exist_ok=True)
    cfg_file = work / "config.json"
    made_for = {**asdict(cfg), "target_weights_sha256_16": target_id, **({"kind": kind} if kind != "eagle3" else {}),
                **({"init_from": init[0]} if init else {})}
    if cfg_file.is_file() and json.loads(cfg_file.read_text()) != made_for:
        raise SystemExit(f"{work} was made with another head-training config or target; remove it to train again.")
    cfg_file.write_text(json.dumps(made_for) + "\n")
    # the target's continuations depend on the target and these settings only: every head kind shares them
    gen_file = work.parent / (f"continuations-{target_id or 'target'}-s{cfg.seed}-n{cfg.generated_sequences}"
                              f"-p{cfg.prompt_len}-c{cfg.context}.npy")
    if gen_file.is_file():
        generated = np.load(gen_file)
    else:
        generated = generate_continuations(target, stream, cfg, eos, log) if cfg.generated_share > 0 else \
            np.zeros((0, cfg.context), dtype=np.int64)
        tmp = gen_file.with_name(gen_file.stem + ".tmp.npy")
        np.save(tmp, generated)
        tmp.replace(gen_file)
    torch.manual_seed(cfg.seed)
    head = KINDS[kind](target)
    if init is not None:
        _start_from(head, init, kind)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95))
    rng = np.random.default_rng(cfg.seed)
    n_steps = max(1, cfg.tokens // (cfg.batch * cfg.context))
    step, curve = 0, []
    ckpt = work / "checkpoint.pt"
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        step, curve = state["step"], state["curve"]
        rng.bit_generator.state = state["rng"]
        log(f"[heads] resumed at step {step}/{n_steps}", flush=True)
    head.train()
    t0, last_ckpt = time.time(), time.time()
    while step < n_steps:
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, n_steps, cfg)
        ids = sample_windows(stream, generated, cfg, rng)
        with torch.no_grad():
            taps, logits = target_view(target, ids, head.cfg.aux_layer_ids)
        loss, losses, accs = ttt_loss(head, ids, taps, logits, cfg.ttt_steps, cfg.step_decay)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % cfg.eval_every == 0 or step == n_steps:
            head.eval()
            ev = evaluate_head(head, target, held, cfg)
            head.train()
            rate = (step - (curve[-1]["step"] if curve else 0)) * cfg.batch * cfg.context / max(time.time() - t0, 1e-9)
            curve.append({"step": step, "tokens": step * cfg.batch * cfg.context, "lr": cosine_lr(step - 1, n_steps, cfg),
                          "train_loss": round(float(loss.detach()), 4), "train_top1_by_step": [round(a, 4) for a in accs],
                          **ev})
            log(f"[{kind}] step {step}/{n_steps} loss {float(loss.detach()):.3f} held-out top-1 by step "
                f"{ev['held_out_top1_by_step']} ({rate:,.0f} tok/s)", flush=True)
            t0 = time.time()
        if time.time() - last_ckpt > 60 * cfg.checkpoint_minutes:
            _save_checkpoint(work, head, opt, step, curve, rng)
            last_ckpt = time.time()
    _save_checkpoint(work, head, opt, step, curve, rng)
    head.eval()
    figures = {"parameters_trained": sum(p.numel() for p in params), "tokens_seen": step * cfg.batch * cfg.context,
               "config": asdict(cfg), "generated_rows": int(len(generated)), "curve": curve,
               **(curve[-1] if curve else {})}
    return head, figures


def held_windows(held_texts: list[str], tok, cfg: HeadTraining, n: int = 32) -> torch.Tensor:
    from svt.models.train_tiny import encode_stream

    held_stream = encode_stream(tok, held_texts)
    rng = np.random.default_rng(cfg.seed + 1)
    starts = rng.integers(0, len(held_stream) - cfg.context, size=n)
    return torch.from_numpy(np.stack([held_stream[s : s + cfg.context] for s in starts]))


def write_figures(out: Path, name: str, figures: dict) -> None:
    """``OUT/training.json``'s ``models.NAME`` replaced (written beside, then swapped)."""
    path = out / "training.json"
    data = json.loads(path.read_text()) if path.is_file() else {"models": {}}
    data.setdefault("models", {})[name] = figures
    tmp = path.with_name(".training.json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def swap_in(stage: Path, dest: Path) -> None:
    """``stage`` replaces ``dest`` (the old one is removed only after the new one is in place)."""
    old = dest.with_name(f".{dest.name}.svt-old")
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    stage.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--target", type=Path, default=Path("data/models/target"))
    ap.add_argument("--out", type=Path, default=Path("data/models"), help="the head goes to OUT/KIND")
    ap.add_argument("--work", type=Path, default=None, help="default build/tiny/KIND-TARGETHASH")
    ap.add_argument("--kind", choices=sorted(KINDS), default="eagle3",
                    help="eagle3 (three fused taps) or mtp (DeepSeek-V3's form over the final hidden state)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the token budget (smoke tests)")
    ap.add_argument("--init-from", type=Path, default=None, metavar="HEAD",
                    help="start from this head's weights (one trained on an earlier target) instead of at random")
    ap.add_argument("--tokens", type=int, default=None, help="window tokens to train on (default: the kind's budget)")
    args = ap.parse_args(argv)
    if args.threads < 1 or not 0 < args.scale <= 1:
        ap.error("--threads must be >= 1 and --scale in (0, 1].")
    torch.set_num_threads(args.threads)
    from svt.models.loading import load_causal_lm, load_tokenizer
    from svt.models.train_tiny import EOS, read_corpus, training_stream

    if args.tokens is not None and args.tokens < 1:
        ap.error("--tokens must be >= 1.")
    cfg = HeadTraining(tokens=args.tokens or TOKENS[args.kind])
    if args.scale != 1.0:
        cfg = HeadTraining(tokens=max(cfg.batch * cfg.context, int(cfg.tokens * args.scale)),
                           generated_sequences=max(2, int(cfg.generated_sequences * args.scale)),
                           eval_every=5, warmup=2)
    hf_tok = load_tokenizer(args.target)
    tok = hf_tok.backend_tokenizer
    train_texts, held_texts, tasks = read_corpus()
    stream, _ = training_stream(tok, train_texts, tasks, seed=0)
    held = held_windows(held_texts, tok, cfg)
    target = load_causal_lm(args.target, "target", torch.device("cpu"), torch.float32)
    for p in target.parameters():
        p.requires_grad_(False)
    from svt.models.loading import weights_hash

    t0 = time.time()
    target_id = weights_hash(args.target)
    work = args.work or Path("build/tiny") / f"{args.kind}-{target_id}"  # a new target never meets an old checkpoint
    init = None
    if args.init_from is not None:
        from svt.errors import SvtError
        from svt.models.heads import load_head

        try:
            init = (f"{args.init_from} ({weights_hash(args.init_from)})", trained_part(load_head(args.init_from, target)))
        except SvtError as exc:
            raise SystemExit(f"--init-from: {exc}") from None
    head, figures = train_head(target, stream, held, cfg, work, eos=tok.token_to_id(EOS), target_id=target_id,
                               kind=args.kind, init=init)
    if init is not None:
        figures["init_from"] = init[0]
    figures["train_seconds_this_session"] = round(time.time() - t0, 1)
    figures["target_weights_sha256_16"] = target_id
    stage = args.out / f".{args.kind}.svt-new"
    shutil.rmtree(stage, ignore_errors=True)
    if args.kind == "mtp":
        from svt.models.mtp import save_mtp

        save_mtp(head, stage, extra={"svt_target_weights_sha256_16": target_id})
    else:  # the target's hash in the head's own directory: a collection with another target refuses it
        save_head(head, stage, extra={"svt_target_weights_sha256_16": target_id})
    swap_in(stage, args.out / args.kind)
    write_figures(args.out, args.kind, figures)
    print(f"[{args.kind}] saved to {args.out / args.kind}: "
          f"{json.dumps({k: v for k, v in figures.items() if k != 'curve'})}")


if __name__ == "__main__":
    main()
