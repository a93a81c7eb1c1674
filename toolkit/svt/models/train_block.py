"""Train the built-in block-parallel drafters on the frozen built-in target (stages of ``make
models``): DFlash (``--kind dflash``: block 6, 5 drafts) and DSpark (``--kind dspark``: block 5,
anchor as first, a vanilla Markov head and a confidence head).

Data, as the EAGLE-3 head's (:mod:`svt.models.train_eagle3`): windows of the training stream and,
for half of them, the target's own continuations of training-stream prompts (the same cached
file). Each window gives ``anchors`` random anchor positions; anchor ``a``'s block ``[t_a, mask ×
(B - 1)]`` sits at positions ``a .. a + B - 1`` and attends to the fused target features of
positions ``0 .. a - 1`` (what serving has computed when ``t_a`` is the pending token) and to its
own block, all blocks of a window in one forward (a block never sees another's slots).

Losses, as published:

- DFlash: cross-entropy of each draft slot ``k = 1 .. B - 1`` against the target's own
  distribution of the token ``k`` after the anchor, weighted ``exp(-(k - 1) / 4)``;
- DSpark: for slot ``k = 0 .. B - 1`` (the token ``k + 1`` after the anchor), the Markov-corrected
  logits ``U_k + W2(W1[t_{a+k}])`` (teacher-forced previous token), ``0.1 · CE + 0.9 · L1(softmax
  draft − softmax target) + 1.0 · BCE(confidence, 1 − TV(p, q))`` (the label analytic, detached),
  every term weighted ``exp(-k / 4)``.

The target's distributions are soft labels at temperature 1 (the sharpened target's own, as the
heads are trained). Layer taps: DFlash's published rule on a 4-layer target gives one id three times
(``build_target_layer_ids(4, 3)`` = [1, 1, 1]); svt taps the distinct layers 0, 1 and 2 (transformers'
``hidden_states[1..3]``, the same residual streams as its EAGLE-3 head's ids 1, 2, 3), the rule's
intent (spread taps, the last layer left out) on a target too shallow for its formula. The mask
token is the training stream's rarest token id (the target's embedding of it, frozen).

Checkpoints every ``checkpoint_minutes`` in ``WORK`` and resumes from them; the curve and per-slot
figures go to ``OUT/training.json`` under ``models.KIND``. ::

    python -m svt.models.train_block --kind dspark --target data/models/target --out data/models
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
import torch.nn.functional as F

from svt.models.block import BlockConfig, BlockDrafter, save_block
from svt.models.train_eagle3 import (
    cosine_lr,
    generate_continuations,
    held_windows,
    sample_windows,
    swap_in,
    target_view,
    write_figures,
)

GAMMA = 4.0
#: DFlash's and DSpark's layouts for the tiny target (K = 5 drafts either way)
LAYOUTS = {"dflash": {"block_size": 6, "sample_from_anchor": False},
           "dspark": {"block_size": 5, "sample_from_anchor": True, "markov_rank": 64, "enable_confidence_head": True}}
#: the tapped target layers (outputs of layers 0, 1, 2: see the module)
TARGET_LAYER_IDS = (0, 1, 2)


@dataclass(frozen=True)
class BlockTraining:
    tokens: int = 2_500_000  # window tokens seen
    batch: int = 8
    context: int = 256
    anchors: int = 24  # anchor blocks a window
    lr: float = 2e-3
    warmup: int = 50
    final_lr_share: float = 0.05
    generated_share: float = 0.5
    generated_sequences: int = 2048  # shared with the heads' continuations file
    prompt_len: int = 64
    seed: int = 0
    eval_every: int = 100
    checkpoint_minutes: float = 5.0
    layers: int = 2


def rarest_token(stream: np.ndarray, vocab: int, avoid: tuple[int, ...] = (0,)) -> int:
    """The id the training stream holds least often (the lowest id among ties), never ``avoid``."""
    counts = np.bincount(stream, minlength=vocab).astype(np.float64)
    counts[list(avoid)] = np.inf
    return int(np.argmin(counts))


def make_block(target, kind: str, mask_token_id: int, layers: int = 2) -> BlockDrafter:
    """A block drafter shaped for ``target``, sharing its embedding and LM head (frozen)."""
    tc = target.config
    cfg = BlockConfig(kind=kind, hidden_size=tc.hidden_size, intermediate_size=tc.intermediate_size,
                      num_attention_heads=tc.num_attention_heads, num_key_value_heads=tc.num_key_value_heads,
                      num_hidden_layers=layers, vocab_size=tc.vocab_size, target_hidden_size=tc.hidden_size,
                      num_target_layers=tc.num_hidden_layers, target_layer_ids=TARGET_LAYER_IDS,
                      mask_token_id=mask_token_id, rms_norm_eps=tc.rms_norm_eps,
                      rope_theta=float((getattr(tc, "rope_parameters", None) or {}).get("rope_theta", 10000.0)),
                      max_position_embeddings=tc.max_position_embeddings, **LAYOUTS[kind])
    model = BlockDrafter(cfg, target.get_input_embeddings(), target.get_output_embeddings())
    with torch.no_grad():
        model.norm.weight.copy_(target.model.norm.weight)  # the LM head reads a normed state on the target's scale
    for p in (*model.embed_tokens.parameters(), *model.lm_head.parameters()):
        p.requires_grad_(False)
    return model


def anchor_batch(n_windows: int, context: int, anchors: int, block: int, rng) -> torch.Tensor:
    """``anchors`` distinct anchor positions a window in [1, context - block - 1]: each has a token
    before it and its labels (up to ``a + block``) inside the window."""
    hi = context - block - 1
    return torch.from_numpy(np.stack([np.sort(rng.choice(np.arange(1, hi + 1), size=min(anchors, hi), replace=False))
                                      for _ in range(n_windows)]))


def block_forward(model: BlockDrafter, ids: torch.Tensor, taps: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
    """Every anchor's block of every window in one forward: hidden states [B, A, block, H]."""
    Bw, C = ids.shape
    A, bs = anchor.shape[1], model.cfg.block_size
    dev = ids.device
    ctx = model.fuse(taps)
    block_ids = torch.full((Bw, A, bs), model.cfg.mask_token_id, dtype=torch.long, device=dev)
    block_ids[:, :, 0] = ids.gather(1, anchor)
    pos = anchor[:, :, None] + torch.arange(bs, device=dev)  # [B, A, bs]
    keys_ctx = torch.arange(C, device=dev)[None, None, :] < anchor[:, :, None]  # [B, A, C]: positions before the anchor
    own = torch.eye(A, dtype=torch.bool, device=dev)[None, :, :, None].expand(Bw, A, A, bs).reshape(Bw, A, A * bs)
    mask = torch.cat([keys_ctx, own], -1)[:, :, None, :].expand(Bw, A, bs, C + A * bs).reshape(Bw, A * bs, -1)
    h = model.run_layers(ctx, torch.arange(C, device=dev)[None].expand(Bw, C), model.embed_tokens(block_ids.view(Bw, -1)),
                         pos.view(Bw, -1), mask)
    return h.view(Bw, A, bs, -1)


def block_loss(model: BlockDrafter, ids: torch.Tensor, taps: torch.Tensor, logits: torch.Tensor,
               anchor: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The published loss of the drafter's kind; per-slot top-1 agreement with the target (and, for
    DSpark, the confidence's mean and its label's)."""
    c = model.cfg
    h = model.draft_slots(block_forward(model, ids, taps, anchor))  # [B, A, n, H]
    n = h.shape[2]
    # draft k predicts t_{a+k+1} in both layouts (DFlash: block slot k + 1; DSpark: slot k), whose
    # target distribution is the target's logits at position a + k; the token before it is t_{a+k}
    where = anchor[:, :, None] + torch.arange(n, device=ids.device)
    p_logits = logits.gather(1, where.view(ids.shape[0], -1, 1).expand(-1, -1, logits.shape[-1])).view(*where.shape, -1)
    p = p_logits.softmax(-1)
    prev = ids.gather(1, where.view(ids.shape[0], -1)).view(where.shape)  # the token before each slot's (teacher-forced)
    lg = model.lm_head(h).float()
    if model.markov_head is not None:
        lg = lg + model.markov_head.markov_w2(model.markov_head.markov_w1(prev)).float()
    logq = lg.log_softmax(-1)
    w = torch.tensor([math.exp(-k / GAMMA) for k in range(n)], device=ids.device)
    ce = -(p * logq).sum(-1)  # [B, A, n]
    acc = (lg.argmax(-1) == p_logits.argmax(-1)).float().mean((0, 1))
    info = {"top1_by_slot": [round(float(x), 4) for x in acc], "ce_by_slot": [round(float(x), 4) for x in ce.detach().mean((0, 1))]}
    if c.kind == "dflash":
        loss = (ce * w).mean((0, 1)).sum() / w.sum()
        return loss, info
    q = logq.exp()
    l1 = (q - p).abs().sum(-1)
    label = (1 - 0.5 * (q - p).abs().sum(-1)).detach().clamp(0, 1)  # 1 - TV(p, q): the analytic acceptance
    conf_in = torch.cat([h, model.markov_head.markov_w1(prev).to(h.dtype)], -1) if c.confidence_head_with_markov else h
    conf_logit = model.confidence_head.proj(conf_in).float().squeeze(-1)
    bce = F.binary_cross_entropy_with_logits(conf_logit, label, reduction="none")
    per = 0.1 * ce + 0.9 * l1 + 1.0 * bce
    loss = (per * w).mean((0, 1)).sum() / w.sum()
    info.update(conf_by_slot=[round(float(x), 4) for x in torch.sigmoid(conf_logit.detach()).mean((0, 1))],
                label_by_slot=[round(float(x), 4) for x in label.mean((0, 1))])
    return loss, info


@torch.no_grad()
def evaluate_block(model, target, held: torch.Tensor, cfg: BlockTraining) -> dict:
    rng = np.random.default_rng(cfg.seed + 7)
    infos = []
    for chunk in held.split(cfg.batch):
        taps, logits = target_view(target, chunk, model.cfg.aux_layer_ids)
        anchor = anchor_batch(chunk.shape[0], chunk.shape[1], cfg.anchors, model.cfg.block_size, rng)
        infos.append(block_loss(model, chunk, taps, logits, anchor)[1])
    return {f"held_out_{k}": [round(float(x), 4) for x in np.mean([i[k] for i in infos], 0)] for k in infos[0]}


def _save_checkpoint(work: Path, model, opt, step: int, curve: list, rng) -> None:
    tmp = work / "checkpoint.pt.tmp"
    own = {n: t for n, t in model.state_dict().items() if not n.startswith(("embed_tokens.", "lm_head."))}
    torch.save({"model": own, "opt": opt.state_dict(), "step": step, "curve": curve, "rng": rng.bit_generator.state}, tmp)
    tmp.replace(work / "checkpoint.pt")


def train_block(target, stream: np.ndarray, held: torch.Tensor, cfg: BlockTraining, work: Path, *, kind: str,
                eos: int, target_id: str, log=print) -> tuple[BlockDrafter, dict]:
    """The whole stage: continuations (shared with the heads'), the loop (checkpointed), the figures."""
    work.mkdir(parents=True, exist_ok=True)
    cfg_file = work / "config.json"
    made_for = {**asdict(cfg), "kind": kind, "target_weights_sha256_16": target_id}
    if cfg_file.is_file() and json.loads(cfg_file.read_text()) != made_for:
        raise SystemExit(f"{work} was made with another training config or target; remove it to train again.")
    cfg_file.write_text(json.dumps(made_for) + "\n")
    gen_file = work.parent / (f"continuations-{target_id or 'target'}-s{cfg.seed}-n{cfg.generated_sequences}"
                              f"-p{cfg.prompt_len}-c{cfg.context}.npy")
    if gen_file.is_file():
        generated = np.load(gen_file)
    else:
        generated = generate_continuations(target, stream, cfg, eos, log)
        tmp = gen_file.with_name(gen_file.stem + ".tmp.npy")
        np.save(tmp, generated)
        tmp.replace(gen_file)
    torch.manual_seed(cfg.seed)
    model = make_block(target, kind, rarest_token(stream, target.config.vocab_size, (eos,)), cfg.layers)
    params = model.own_parameters()
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.95))
    rng = np.random.default_rng(cfg.seed)
    n_steps = max(1, cfg.tokens // (cfg.batch * cfg.context))
    step, curve = 0, []
    ckpt = work / "checkpoint.pt"
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"], strict=False)
        opt.load_state_dict(state["opt"])
        step, curve = state["step"], state["curve"]
        rng.bit_generator.state = state["rng"]
        log(f"[{kind}] resumed at step {step}/{n_steps}", flush=True)
    model.train()
    t0, last_ckpt = time.time(), time.time()
    while step < n_steps:
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, n_steps, cfg)
        ids = sample_windows(stream, generated, cfg, rng)
        anchor = anchor_batch(ids.shape[0], ids.shape[1], cfg.anchors, model.cfg.block_size, rng)
        with torch.no_grad():
            taps, logits = target_view(target, ids, model.cfg.aux_layer_ids)
        loss, info = block_loss(model, ids, taps, logits, anchor)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % cfg.eval_every == 0 or step == n_steps:
            model.eval()
            ev = evaluate_block(model, target, held, cfg)
            model.train()
            rate = (step - (curve[-1]["step"] if curve else 0)) * cfg.batch * cfg.context / max(time.time() - t0, 1e-9)
            curve.append({"step": step, "tokens": step * cfg.batch * cfg.context, "lr": cosine_lr(step - 1, n_steps, cfg),
                          "train_loss": round(float(loss.detach()), 4), **{f"train_{k}": v for k, v in info.items()},
                          **ev})
            log(f"[{kind}] step {step}/{n_steps} loss {float(loss.detach()):.3f} held-out top-1 by slot "
                f"{ev['held_out_top1_by_slot']} ({rate:,.0f} tok/s)", flush=True)
            t0 = time.time()
        if time.time() - last_ckpt > 60 * cfg.checkpoint_minutes:
            _save_checkpoint(work, model, opt, step, curve, rng)
            last_ckpt = time.time()
    _save_checkpoint(work, model, opt, step, curve, rng)
    model.eval()
    figures = {"parameters_trained": sum(p.numel() for p in params), "tokens_seen": step * cfg.batch * cfg.context,
               "config": asdict(cfg), "layout": {k: v for k, v in model.cfg.to_hf().items() if k.endswith("_config")},
               "generated_rows": int(len(generated)), "curve": curve, **(curve[-1] if curve else {})}
    return model, figures


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--target", type=Path, default=Path("data/models/target"))
    ap.add_argument("--out", type=Path, default=Path("data/models"), help="the drafter goes to OUT/KIND")
    ap.add_argument("--work", type=Path, default=None, help="default build/tiny/KIND-TARGETHASH")
    ap.add_argument("--kind", choices=sorted(LAYOUTS), required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=None, help="window tokens to train on (default 2,500,000)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the token budget (smoke tests)")
    ap.add_argument("--anchors", type=int, default=BlockTraining.anchors, help="anchor blocks a training window")
    args = ap.parse_args(argv)
    if args.threads < 1 or not 0 < args.scale <= 1 or (args.tokens is not None and args.tokens < 1) or args.anchors < 1:
        ap.error("--threads, --tokens and --anchors must be >= 1 and --scale in (0, 1].")
    torch.set_num_threads(args.threads)
    from svt.models.loading import load_causal_lm, load_tokenizer, weights_hash
    from svt.models.train_tiny import EOS, read_corpus, training_stream

    cfg = BlockTraining(tokens=args.tokens or BlockTraining.tokens, anchors=args.anchors)
    if args.scale != 1.0:
        cfg = BlockTraining(tokens=max(cfg.batch * cfg.context, int(cfg.tokens * args.scale)), anchors=args.anchors,
                            generated_sequences=max(2, int(cfg.generated_sequences * args.scale)), eval_every=5, warmup=2)
    hf_tok = load_tokenizer(args.target)
    tok = hf_tok.backend_tokenizer
    train_texts, held_texts, tasks = read_corpus()
    stream, _ = training_stream(tok, train_texts, tasks, seed=0)
    held = held_windows(held_texts, tok, cfg)
    target = load_causal_lm(args.target, "target", torch.device("cpu"), torch.float32)
    for p in target.parameters():
        p.requires_grad_(False)
    t0 = time.time()
    target_id = weights_hash(args.target)
    work = args.work or Path("build/tiny") / f"{args.kind}-{target_id}"
    model, figures = train_block(target, stream, held, cfg, work, kind=args.kind, eos=tok.token_to_id(EOS),
                                 target_id=target_id)
    figures["train_seconds_this_session"] = round(time.time() - t0, 1)
    figures["target_weights_sha256_16"] = target_id
    stage = args.out / f".{args.kind}.svt-new"
    shutil.rmtree(stage, ignore_errors=True)
    save_block(model, stage, extra={"svt_target_weights_sha256_16": target_id})
    swap_in(stage, args.out / args.kind)
    write_figures(args.out, args.kind, figures)
    print(f"[{args.kind}] saved to {args.out / args.kind}: "
          f"{json.dumps({k: v for k, v in figures.items() if k != 'curve'})}")


if __name__ == "__main__":
    main()
