"""Block-parallel drafters: DFlash and DSpark, in the form their public code defines them.

DFlash (z-lab, 2025) drafts a whole block in **one** forward of a few decoder layers:

- the context is the target's own hidden states: the outputs of target layers ``target_layer_ids``
  (id ``i`` is transformers' ``hidden_states[i + 1]``, the residual stream *leaving* layer ``i``;
  svt's EAGLE-3 ids index ``hidden_states[k]`` directly), concatenated, fused by ``fc``
  (``n · H_t -> H``) and ``hidden_norm``; every layer projects that context with its own ``k_proj``
  and ``v_proj`` and appends the block's keys and values;
- the block is the last committed token followed by ``block_size - 1`` mask tokens (the target's
  embedding of ``mask_token_id``); its queries attend to the whole context and to the whole block
  (**non-causal**), so each slot's distribution depends on the context and the block only, never
  on other sampled drafts;
- the target's embedding and LM head are shared and frozen (the checkpoint holds neither).

DFlash's block is ``[anchor, mask × (B - 1)]`` and its drafts are slots ``1 .. B - 1`` (slot ``k``
predicts the token ``k`` after the anchor). DSpark (arXiv 2607.05147) keeps the backbone with the
layout "anchor as first" (``sample_from_anchor``): every slot ``k = 0 .. B - 1`` is a draft and
predicts the token ``k + 1`` after the anchor; and it adds two heads:

- a **Markov head** (``markov_head_type: vanilla``, the type vLLM loads): ``markov_w1``
  ``Embedding(V, r)``, ``markov_w2`` ``Linear(r, V)``; slot ``k``'s logits are ``U_k +
  W2(W1[x_{k-1}])`` with ``x_{-1}`` the anchor, sampled **in order**, so ``q_k`` is conditional on
  the draft sampled before it (per-position rejection sampling stays lossless);
- a **confidence head** ``Linear(H + r, 1)`` on ``[h_k ; W1[x_{k-1}]]``: the probability that slot
  ``k`` is accepted given its prefix was (it reads the previous token, never the drafted one).

The published ``config.json`` fields are written in full (``block_size``, ``mask_token_id``,
``target_layer_ids``, ``num_target_layers``, and DSpark's ``sample_from_anchor``, ``markov_rank``,
``markov_head_type``, ``enable_confidence_head``, ``confidence_head_with_markov``), under
``dflash_config`` as newer checkpoints nest them and ``block_size`` also at the top level as older
ones read it.

In svt's engine the drafter keeps a KV cache of its context (``engine._Cache`` over a
``growing_cache`` of its layers): each draft feeds the target features of the tokens verified since
the last one as context slots (kept) and the block (dropped after the draft), in one forward.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from svt.models.eagle3 import GatedMLP, RMSNorm, apply_rope, rope_tables

ARCHITECTURES = {"dflash": "DFlashDraftModel", "dspark": "DSparkDraftModel"}


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """DFlash's published rule: the middle layer for one draft layer, else ``round(1 + i (N - 4) /
    (L - 1))``, evenly from 1 to N - 3. On a 4-layer target it gives one id repeated."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    return [int(round(1 + i * (num_target_layers - 4) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


@dataclass
class BlockConfig:
    """The drafter's shape and layout; ``to_hf``/``from_hf`` write and read the published form."""

    kind: str = "dflash"  # dflash | dspark
    hidden_size: int = 256
    intermediate_size: int = 768
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    num_hidden_layers: int = 2
    vocab_size: int = 2048
    target_hidden_size: int = 256
    num_target_layers: int = 4
    target_layer_ids: tuple[int, ...] = (0, 1, 2)
    block_size: int = 6
    mask_token_id: int = 1
    sample_from_anchor: bool = False  # DSpark's "anchor as first": every slot is a draft
    markov_rank: int = 0  # DSpark: the Markov head's rank (0: none)
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = False
    confidence_head_with_markov: bool = True
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    extra: dict = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def n_drafts(self) -> int:
        """Draft slots in a block: all of them anchor-as-first, all but the anchor otherwise."""
        return self.block_size if self.sample_from_anchor else self.block_size - 1

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        """The target's ``hidden_states`` indices the context reads (``target_layer_ids`` + 1)."""
        return tuple(i + 1 for i in self.target_layer_ids)

    def to_hf(self) -> dict:
        layout = {"mask_token_id": self.mask_token_id, "target_layer_ids": list(self.target_layer_ids),
                  "block_size": self.block_size}
        if self.kind == "dspark":
            layout.update(sample_from_anchor=self.sample_from_anchor, markov_rank=self.markov_rank,
                          markov_head_type=self.markov_head_type,
                          enable_confidence_head=self.enable_confidence_head,
                          confidence_head_with_markov=self.confidence_head_with_markov)
        return {**self.extra, "architectures": [ARCHITECTURES[self.kind]], "model_type": "llama",
                "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
                "num_attention_heads": self.num_attention_heads, "num_key_value_heads": self.num_key_value_heads,
                "num_hidden_layers": self.num_hidden_layers, "head_dim": self.head_dim, "hidden_act": "silu",
                "vocab_size": self.vocab_size, "target_hidden_size": self.target_hidden_size,
                "num_target_layers": self.num_target_layers, "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta, "max_position_embeddings": self.max_position_embeddings,
                "block_size": self.block_size, "tie_word_embeddings": True, f"{'dflash'}_config": layout,
                **({k: v for k, v in layout.items() if k != "block_size"} if self.kind == "dspark" else {})}

    def llama_config(self):
        """A ``LlamaConfig`` of the drafter's attention shape (for ``growing_cache``)."""
        from transformers import LlamaConfig

        return LlamaConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_hidden_layers=self.num_hidden_layers,
                           num_attention_heads=self.num_attention_heads, num_key_value_heads=self.num_key_value_heads,
                           head_dim=self.head_dim, max_position_embeddings=self.max_position_embeddings,
                           rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta})


class _BlockAttention(nn.Module):
    def __init__(self, c: BlockConfig):
        super().__init__()
        hd = c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * hd, c.hidden_size, bias=False)


class _BlockLayer(nn.Module):
    def __init__(self, c: BlockConfig):
        super().__init__()
        self.self_attn = _BlockAttention(c)
        self.mlp = GatedMLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class MarkovHead(nn.Module):
    def __init__(self, c: BlockConfig):
        super().__init__()
        self.markov_w1 = nn.Embedding(c.vocab_size, c.markov_rank)
        self.markov_w2 = nn.Linear(c.markov_rank, c.vocab_size, bias=False)


class ConfidenceHead(nn.Module):
    def __init__(self, c: BlockConfig):
        super().__init__()
        self.proj = nn.Linear(c.hidden_size + (c.markov_rank if c.confidence_head_with_markov else 0), 1)


@dataclass
class BlockOutput:
    hidden: torch.Tensor  # [B, S, H] the block slots' final (normed) hidden states; empty without a block
    logits: torch.Tensor | None = None  # [B, S, V] the LM head over them (before any Markov correction)


class BlockDrafter(nn.Module):
    """DFlash or DSpark over a target whose embedding and LM head it shares (frozen)."""

    def __init__(self, config: BlockConfig, embed: nn.Embedding, lm_head: nn.Module):
        super().__init__()
        c = self.cfg = config
        self.kind = c.kind
        self.config = c.llama_config()
        self.embed_tokens, self.lm_head = embed, lm_head
        self.fc = nn.Linear(len(c.target_layer_ids) * c.target_hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(_BlockLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.markov_head = MarkovHead(c) if c.markov_rank > 0 else None
        self.confidence_head = ConfidenceHead(c) if c.enable_confidence_head else None
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        rot = LlamaRotaryEmbedding(self.config)
        self.register_buffer("inv_freq", rot.inv_freq.detach().clone().float(), persistent=False)
        self.rope_scale = float(rot.attention_scaling)

    def own_parameters(self):
        """The trained parameters (the shared embedding and LM head stay the target's)."""
        shared = {id(p) for p in (*self.embed_tokens.parameters(), *self.lm_head.parameters())}
        return [p for p in self.parameters() if id(p) not in shared]

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """The context feature of each position from the concatenated taps [..., n · H_t]."""
        return self.hidden_norm(self.fc(taps))

    def _split(self, x: torch.Tensor, n: int) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.cfg.head_dim).transpose(1, 2)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return apply_rope(x, *rope_tables(positions, self.inv_freq, self.rope_scale, x.dtype))

    def run_layers(self, ctx: torch.Tensor, ctx_pos: torch.Tensor, block: torch.Tensor, block_pos: torch.Tensor,
                   mask: torch.Tensor, cache=None) -> torch.Tensor:
        """The backbone. ``ctx`` [B, S, H] fused context features at ``ctx_pos``; ``block`` [B, T, H]
        block embeddings at ``block_pos``; ``mask`` [B, T, keys] what each block slot attends to
        among the keys: (with ``cache``) the cache's past slots, then ``ctx``'s and the block's,
        which are appended to it (the engine turns the block's into holes after the draft); without,
        ``ctx``'s then the block's. Returns the block's normed hidden states [B, T, H]."""
        c = self.cfg
        rep = c.num_attention_heads // c.num_key_value_heads
        h, T = block, block.shape[1]
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            k = self._rope(self._split(a.k_proj(ctx), c.num_key_value_heads), ctx_pos)
            v = self._split(a.v_proj(ctx), c.num_key_value_heads)
            if T:
                x = layer.input_layernorm(h)
                q = self._rope(self._split(a.q_proj(x), c.num_attention_heads), block_pos)
                k = torch.cat([k, self._rope(self._split(a.k_proj(x), c.num_key_value_heads), block_pos)], 2)
                v = torch.cat([v, self._split(a.v_proj(x), c.num_key_value_heads)], 2)
            if cache is not None:
                k, v = cache.layers[i].update(k, v)
            if not T:
                continue
            if rep > 1:
                k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None].bool())
            B = attn.shape[0]
            r = a.o_proj(attn.transpose(1, 2).reshape(B, T, -1)) + h
            h = layer.mlp(layer.post_attention_layernorm(r)) + r
        return self.norm(h)

    def block_inputs(self, anchor: torch.Tensor) -> torch.Tensor:
        """The block's embeddings [B, block_size, H]: the anchor then the mask tokens."""
        ids = anchor[:, None].repeat(1, self.cfg.block_size)
        ids[:, 1:] = self.cfg.mask_token_id
        return self.embed_tokens(ids)

    def draft_slots(self, hidden: torch.Tensor) -> torch.Tensor:
        """The block's draft slots' hidden states [..., n_drafts, H] of ``hidden`` [..., block, H]."""
        return hidden if self.cfg.sample_from_anchor else hidden[..., 1:, :]

    def slot_logits(self, h: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
        """One draft slot's logits [B, V] from its hidden state [B, H]: the LM head, plus (DSpark)
        the Markov head's correction from the token sampled before it."""
        logits = self.lm_head(h).float()
        if self.markov_head is not None:
            logits = logits + self.markov_head.markov_w2(self.markov_head.markov_w1(previous)).float()
        return logits

    def confidence(self, h: torch.Tensor, previous: torch.Tensor) -> torch.Tensor | None:
        """The confidence head's acceptance probability of a slot [B] given its prefix survived."""
        if self.confidence_head is None:
            return None
        x = h
        if self.cfg.confidence_head_with_markov and self.markov_head is not None:
            x = torch.cat([h, self.markov_head.markov_w1(previous).to(h.dtype)], -1)
        return torch.sigmoid(self.confidence_head.proj(x).float()).squeeze(-1)

    # -- the engine's entry: a catch-up of context slots, optionally followed by a block --------
    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor, cache, block: int = 0, **_) -> BlockOutput:
        """``input_ids`` [B, S + block] (the context slots' ids are not read; the last ``block`` are
        the block's), ``features`` [B, S, H] fused context, ``attention_mask`` [B, past + S + block]
        (0 = hole), ``position_ids`` [B, S + block]. The context's keys and values are appended to
        ``cache``; the block's are appended too (the engine drops them after the draft: they are
        holes from then on) and every block slot attends to every live slot and the whole block."""
        S = features.shape[1]
        if block == 0:
            empty = features.new_zeros((features.shape[0], 0, self.cfg.hidden_size))
            self.run_layers(features, position_ids[:, :S], empty, position_ids[:, :0], attention_mask[:, None, :0], cache)
            return BlockOutput(empty)
        emb = self.embed_tokens(input_ids[:, S:])
        mask = attention_mask.bool()[:, None, :].expand(-1, block, -1)  # non-causal: every live slot, the whole block
        return BlockOutput(self.run_layers(features, position_ids[:, :S], emb, position_ids[:, S:], mask, cache))


# -- the published directory form ----------------------------------------------------------------
def save_block(model: BlockDrafter, path: Path, dtype: torch.dtype = torch.bfloat16, extra: dict | None = None) -> None:
    """``config.json`` + ``model.safetensors`` in the published form (the shared embedding and LM
    head are not saved: the checkpoint reads its target's)."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    shared = ("embed_tokens.", "lm_head.")
    state = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous()
             for k, v in model.state_dict().items() if not k.startswith(shared)}
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    cfg = model.cfg.to_hf()
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    cfg.update(extra or {})
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def block_kind(cfg: dict) -> str | None:
    """``dflash`` / ``dspark`` for a published block drafter's config.json, else None."""
    arch = cfg.get("architectures") if isinstance(cfg, dict) else None
    if not isinstance(arch, list):
        return None
    for kind, name in ARCHITECTURES.items():
        if name in arch:
            return kind
    return None


def config_from_hf(d: dict, where: str) -> BlockConfig:
    """A published ``config.json`` as a :class:`BlockConfig` (``block_size`` at the top level or in
    ``dflash_config``); a missing layout field is one error naming it."""
    from svt.errors import ModelLoadError

    kind = block_kind(d)
    layout = {**{k: d[k] for k in ("block_size", "mask_token_id", "target_layer_ids") if k in d},
              **(d.get("dflash_config") or {})}
    for key in ("block_size", "mask_token_id", "target_layer_ids"):
        if key not in layout:
            raise ModelLoadError(f"{where}: config.json has no `{key}` (top level or under `dflash_config`): a "
                                 f"{kind} drafter's layout needs it.")
    dspark = {k: layout.get(k, d.get(k)) for k in ("sample_from_anchor", "markov_rank", "markov_head_type",
                                                   "enable_confidence_head", "confidence_head_with_markov")}
    if kind == "dspark" and dspark["sample_from_anchor"] is None:
        raise ModelLoadError(f"{where}: a DSpark config.json must say `sample_from_anchor` (its block layout; a "
                             "mismatch drops the accepted length to about 1).")
    if (dspark["markov_head_type"] or "vanilla") != "vanilla":
        raise ModelLoadError(f"{where}: `markov_head_type` {dspark['markov_head_type']!r}: svt (as vLLM) loads the "
                             "vanilla Markov head only.")
    def whole(name: str, value, lo: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise ModelLoadError(f"{where}: expected `{name}` to be an integer >= {lo}, but got {value!r}.")
        return value

    for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "vocab_size"):
        whole(name, d.get(name))
    for name in ("num_key_value_heads", "target_hidden_size"):
        if name in d:
            whole(name, d[name])
    whole("block_size", layout["block_size"])
    whole("mask_token_id", layout["mask_token_id"], 0)
    ids = layout["target_layer_ids"]
    if not isinstance(ids, list) or not ids:
        raise ModelLoadError(f"{where}: expected `target_layer_ids` to be a non-empty list of layer ids, but got {ids!r}.")
    for i in ids:
        whole("target_layer_ids", i, 0)
    if dspark["markov_rank"] is not None:
        whole("markov_rank", dspark["markov_rank"], 0)
    known = set(BlockConfig.__dataclass_fields__)
    return BlockConfig(
        kind=kind, hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
        num_attention_heads=d["num_attention_heads"], num_key_value_heads=d.get("num_key_value_heads",
                                                                                d["num_attention_heads"]),
        num_hidden_layers=d["num_hidden_layers"], vocab_size=d["vocab_size"],
        target_hidden_size=d.get("target_hidden_size", d["hidden_size"]),
        num_target_layers=d.get("num_target_layers", 0), target_layer_ids=tuple(layout["target_layer_ids"]),
        block_size=int(layout["block_size"]), mask_token_id=int(layout["mask_token_id"]),
        sample_from_anchor=bool(dspark["sample_from_anchor"]), markov_rank=int(dspark["markov_rank"] or 0),
        markov_head_type=dspark["markov_head_type"] or "vanilla",
        enable_confidence_head=bool(dspark["enable_confidence_head"]),
        confidence_head_with_markov=bool(dspark["confidence_head_with_markov"]
                                         if dspark["confidence_head_with_markov"] is not None else True),
        rms_norm_eps=d.get("rms_norm_eps", 1e-6), rope_theta=d.get("rope_theta", 10000.0),
        max_position_embeddings=d.get("max_position_embeddings", 2048),
        extra={k: v for k, v in d.items() if k not in known})


def decayed(n: int, gamma: float, start: int = 0) -> torch.Tensor:
    """Slot weights exp(-(k - start) / gamma), k = 0 .. n - 1 (DFlash: start 1; DSpark: 0)."""
    return torch.tensor([math.exp(-(k - start) / gamma) for k in range(n)])


__all__ = ["BlockConfig", "BlockDrafter", "asdict", "build_target_layer_ids", "config_from_hf", "save_block"]

