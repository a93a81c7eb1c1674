"""The induction gate: does a model copy from its context?

On random token strings written twice (``length`` tokens, then the same tokens again), a model that
has formed induction heads predicts the second copy from the first: after token x_i of the repeat it
attends to the token that followed x_i's earlier twin and writes it. Measured here, for a causal LM
(any Hugging Face model; the tiny pair's target in ``svt.models.train_tiny``):

- ``top1``: greedy top-1 accuracy on the second copy (positions 2..length of it; the first token of
  the repeat follows a random token and cannot be predicted from the first copy);
- ``cross_entropy``: the model's mean cross-entropy there, in nats, as trained (no sharpening);
- ``induction_score``: per layer and head, the mean attention from each of those repeat tokens to
  the token after its earlier twin (1.0: a perfect induction head; a uniform head scores about
  1 / position);
- ``first_copy_cross_entropy``: the same cross-entropy on the first copy (random tokens: about
  log(vocabulary) for a model that has learnt the unigram statistics only).

The strings are drawn from a seeded generator over the vocabulary without the special tokens and
start after one end-of-sequence token, as documents do in the training stream.

Findings of Olsson et al. ("In-context Learning and Induction Heads", Anthropic, 2022) and of
Aoyama, Wilcox and Schneider ("Predicting the Emergence of Induction Heads in Language Model
Pretraining", arXiv 2511.16893, 2025) motivate the gate; nothing here depends on their code.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

GATE_TOP1 = 0.90  # issue 33's goals: top-1 on the repeat >= 90 %
GATE_CE = 1.0  # and cross-entropy there <= 1 nat


def repeated_strings(n: int, length: int, vocab: int, seed: int, bos: int, low: int = 1) -> torch.Tensor:
    """``n`` sequences ``[bos, x_1..x_L, x_1..x_L]`` of uniform random tokens in [low, vocab)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(low, vocab, size=(n, length))
    return torch.from_numpy(np.concatenate([np.full((n, 1), bos), x, x], axis=1)).long()


@torch.no_grad()
def induction_gate(model, *, vocab: int, bos: int, length: int = 30, n: int = 64, seed: int = 1234,
                   heads: bool = True) -> dict:
    """The gate's figures for ``model`` (see the module docstring). ``heads`` also measures the
    per-head induction score (needs attention weights: the eager attention path)."""
    was_training = model.training
    model.eval()
    seqs = repeated_strings(n, length, vocab, seed, bos)
    device = next(model.parameters()).device
    seqs = seqs.to(device)
    impl = getattr(model.config, "_attn_implementation", None)
    if heads and impl != "eager":
        model.config._attn_implementation = "eager"
    try:
        out = model(input_ids=seqs, output_attentions=heads)
    finally:
        if heads and impl != "eager":
            model.config._attn_implementation = impl
    logits = out.logits.float()
    # position p predicts token p + 1; the repeat's tokens sit at 1 + length .. 2 * length
    rep_pred = torch.arange(length + 1, 2 * length, device=device)  # predicts repeat tokens 2..L
    first_pred = torch.arange(1, length, device=device)  # predicts first-copy tokens 2..L
    target = seqs[:, rep_pred + 1]
    lp = logits[:, rep_pred].log_softmax(-1)
    ce = -lp.gather(-1, target[..., None]).squeeze(-1)
    top1 = (logits[:, rep_pred].argmax(-1) == target).float()
    ce_first = F.cross_entropy(logits[:, first_pred].reshape(-1, logits.shape[-1]),
                               seqs[:, first_pred + 1].reshape(-1))
    result = {"top1": float(top1.mean()), "cross_entropy": float(ce.mean()),
              "first_copy_cross_entropy": float(ce_first), "length": length, "strings": n, "seed": seed}
    if heads and out.attentions is not None:
        # the repeat token at position q = 1 + L + i (its twin at 1 + i) attends to 2 + i
        q = torch.arange(length + 1, 2 * length + 1, device=device)
        k = q - length + 1
        scores = [att[:, :, q[:-1], k[:-1]].float().mean(dim=(0, 2)).tolist() for att in out.attentions]
        result["induction_score"] = [[round(s, 4) for s in layer] for layer in scores]
        result["max_induction_score"] = round(max(max(layer) for layer in scores), 4)
    if was_training:
        model.train()
    return result


def passes(gate: dict) -> bool:
    return gate["top1"] >= GATE_TOP1 and gate["cross_entropy"] <= GATE_CE


def main(argv: list[str] | None = None) -> None:
    """``python -m svt.models.induction MODEL_DIR``: the gate of a saved causal LM, printed as JSON
    (exit 1 when it fails the gate). ``--unsharpen F`` divides the final norm by F first (the tiny
    target is saved sharpened; its ``training.json`` records F as ``models.target.sharpen``)."""
    import argparse
    import json
    from pathlib import Path

    p = argparse.ArgumentParser(prog="python -m svt.models.induction", description=main.__doc__)
    p.add_argument("model", type=Path, help="a Hugging Face causal LM folder (config.json, weights, tokenizer)")
    p.add_argument("--unsharpen", type=float, default=None, help="divide the final norm by this factor first")
    p.add_argument("--length", type=int, default=30)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    if not (args.model / "config.json").is_file():
        p.error(f"{args.model}: not a model folder (no config.json)")
    if args.length < 2 or args.samples < 1 or (args.unsharpen is not None and not args.unsharpen > 0):
        p.error("expected --length >= 2, --samples >= 1 and --unsharpen > 0")
    from svt.errors import SvtError
    from svt.models.loading import load_causal_lm, load_tokenizer

    try:
        model = load_causal_lm(args.model, "model", torch.device("cpu"), torch.float32)
        tok = load_tokenizer(args.model)
    except SvtError as exc:
        p.exit(2, f"error: {exc}\n")
    if args.unsharpen is not None:
        with torch.no_grad():
            model.model.norm.weight.div_(args.unsharpen)
    bos = tok.eos_token_id if tok.eos_token_id is not None else 0
    g = induction_gate(model, vocab=int(model.config.vocab_size), bos=bos, length=args.length, n=args.samples,
                       seed=args.seed)
    g = {k: v for k, v in g.items() if k != "induction_score"} | {"passes": passes(g), "gate": {
        "top1_at_least": GATE_TOP1, "cross_entropy_at_most": GATE_CE}}
    print(json.dumps(g, indent=2, default=float))
    raise SystemExit(0 if g["passes"] else 1)


if __name__ == "__main__":
    main()
