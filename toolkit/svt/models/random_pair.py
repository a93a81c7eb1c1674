"""A target/draft pair of a realistic shape with random weights, for timing on a GPU (speed, not
quality): ``python -m svt.models.random_pair --out DIR [--size 1b|tiny] [--device cuda]``.

``1b`` is a Llama of TinyLlama-1.1B's shape (22 layers, width 2048, 32 heads with 4 key/value heads,
FFN 5632, vocabulary 32,000) and a 2-layer, 1024-wide drafter of the same vocabulary; ``tiny`` is a
small pair of the same kind for dry runs on a CPU. Both ship the built-in tokenizer (its 2,048
tokens are a subset of the vocabulary), so svt's loading code and `svt collect --profile-costs` read
them as any local checkpoint. Saved in bfloat16 with ``save_pretrained``.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

SHAPES = {
    "1b": {"target": dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                          intermediate_size=5632),
           "draft": dict(hidden_size=1024, num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=4,
                         intermediate_size=2816),
           "vocab": 32000},
    "tiny": {"target": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=256),
             "draft": dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                           intermediate_size=128),
             "vocab": 4096},
}


def make_pair(out: Path, size: str = "1b", device: str = "cpu", seed: int = 0,
              tokenizer_from: Path | None = None) -> dict[str, int]:
    """Write ``out/target`` and ``out/draft``; returns their parameter counts."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = SHAPES[size]
    tok_dir = tokenizer_from or Path(__file__).resolve().parents[3] / "data" / "models" / "target"
    counts = {}
    for role in ("target", "draft"):
        torch.manual_seed(seed + (role == "draft"))
        cfg = LlamaConfig(vocab_size=shape["vocab"], max_position_embeddings=4096, tie_word_embeddings=False,
                          bos_token_id=0, eos_token_id=0, pad_token_id=0, **shape[role])
        with torch.device(device):
            model = LlamaForCausalLM(cfg).to(torch.bfloat16)
        path = out / role
        model.save_pretrained(path)
        for f in tok_dir.iterdir():
            if f.name.startswith(("tokenizer", "special_tokens")):
                shutil.copy(f, path / f.name)
        counts[role] = sum(p.numel() for p in model.parameters())
        del model
    return counts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--size", choices=sorted(SHAPES), default="1b")
    ap.add_argument("--device", default="cpu", help="where the random weights are made (cuda is faster)")
    args = ap.parse_args(argv)
    print(make_pair(args.out, args.size, args.device))


if __name__ == "__main__":
    main()
