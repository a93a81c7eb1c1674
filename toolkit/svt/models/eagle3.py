"""An EAGLE-3 draft head, in the form the published checkpoints and vLLM define it.

EAGLE-3 (Li et al., "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test", 2025) drafts with one decoder layer that reads the target's own features:

- ``fc`` fuses three tapped hidden states of the target (``[3 * H_t] -> [H]``); tap id ``k`` is the
  residual stream *entering* target layer ``k`` (0 = the embeddings), i.e. transformers'
  ``hidden_states[k]`` (``eagle_aux_hidden_state_layer_ids`` in the head's ``config.json``);
- ``midlayer``: attention over ``cat(input_layernorm(emb(token)), hidden_norm(feature))`` (``2H``
  in), the feature as the residual, a post-attention norm and a SiLU MLP;
- ``norm`` and ``lm_head`` over a draft vocabulary; when it is smaller than the target's, ``d2t``
  maps draft id ``i`` to target id ``i + d2t[i]``; no ``embed_tokens`` means the target's embedding
  is shared.

Position ``i`` sees the feature of token ``t_i`` and the embedding of ``t_{i+1}`` and predicts
``t_{i+2}``. Later draft steps feed the layer's own pre-norm output (``mlp + residual``) as the next
feature. Weights are stored under the published names (``fc.weight``, ``midlayer.*``,
``norm.weight``, ``lm_head.weight``, ``d2t``), so vLLM and SpecForge-style tools load the directory
as it is.

Two forward paths share one layer: :meth:`Eagle3Head.forward` with a KV cache (the engine's, with
holes and a 2D mask, as for a draft model) and :meth:`Eagle3Head.ttt` (training-time test: every
position's chain unrolled ``steps`` deep at once, each step attending to the step-0 prefix plus its
own chain's earlier steps), which the training and the engine's exactness tests use.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ARCHITECTURE = "LlamaForCausalLMEagle3"
#: the names vLLM maps to its EAGLE-3 Llama drafter
ARCHITECTURES = (ARCHITECTURE, "Eagle3LlamaForCausalLM")


@dataclass
class Eagle3Config:
    """The head's shape; ``to_hf``/``from_hf`` read and write the published ``config.json``."""

    hidden_size: int = 256
    intermediate_size: int = 768
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    vocab_size: int = 2048  # the target's vocabulary
    draft_vocab_size: int = 2048
    target_hidden_size: int = 256
    aux_layer_ids: tuple[int, ...] = (1, 2, 3)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    norm_before_residual: bool = False  # vLLM's flag: the residual is the normed feature
    rope_scaling: dict | None = None  # e.g. Llama 3.1's {"rope_type": "llama3", "factor": 8.0, ...}
    bos_token_id: int = 0
    eos_token_id: int = 0
    pad_token_id: int = 0
    extra: dict = field(default_factory=dict)  # fields of a published config svt does not use

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_hf(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("aux_layer_ids", "rope_theta", "rope_scaling", "extra")}
        return {
            **self.extra,
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "head_dim": self.head_dim,
            "tie_word_embeddings": False,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
            **d,
        }

    def llama_config(self):
        """A one-layer ``LlamaConfig`` of the head's attention shape (for ``growing_cache``)."""
        from transformers import LlamaConfig

        rope = {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}
        longest = max(self.max_position_embeddings, int(rope.get("original_max_position_embeddings", 0)) + 1)
        return LlamaConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_hidden_layers=1,
                           num_attention_heads=self.num_attention_heads,
                           num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
                           max_position_embeddings=longest, rope_parameters=rope)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


#: rotary types whose frequencies do not depend on the sequence length (transformers computes them)
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype) -> tuple:
    """cos and sin [B, 1, T, d/2] at ``positions`` [B, T] for the frequencies ``inv_freq`` [d/2] and
    the cos/sin ``scaling`` of the head's rope type (computed once for q and k)."""
    ang = positions[:, None, :, None].float() * inv_freq.float()
    if scaling != 1.0:
        return (torch.cos(ang) * scaling).to(dtype), (torch.sin(ang) * scaling).to(dtype)
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (Llama's rotate-half form) of ``x`` [B, h, T, d]."""
    x1, x2 = x.chunk(2, -1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float = 1.0) -> torch.Tensor:
    """``apply_rope`` at ``positions`` [B, T] (see ``rope_tables``)."""
    return apply_rope(x, *rope_tables(positions, inv_freq, scaling, x.dtype))


class _Attention(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        hd = c.head_dim
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * hd, c.hidden_size, bias=False)


class GatedMLP(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        self.self_attn = _Attention(c)
        self.mlp = GatedMLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)


@dataclass
class HeadOutput:
    logits: torch.Tensor  # [B, T, V] over the *target's* vocabulary (-inf outside the draft vocabulary)
    hidden: torch.Tensor  # [B, T, H] pre-norm output: the next step's feature
    last_hidden: torch.Tensor  # [B, T, H] after the final norm (what the LM head reads)


class HiddenStateHead(nn.Module):
    """What every hidden-state head shares: one decoder layer run with a KV cache (:meth:`forward`)
    or unrolled by training-time test (:meth:`ttt`). A subclass holds its modules and defines
    ``fuse`` (the target's taps -> the step-0 feature), ``_inputs`` (token and feature -> attention
    input and residual), ``_attention`` (the q/k/v/o projections) and ``_finish``; ``kind`` names it
    in run.json, ``cfg.aux_layer_ids`` says which of the target's hidden states it reads."""

    kind = ""
    cfg: Eagle3Config

    def _init_rope(self) -> None:
        """The rotary frequencies of the head's rope type, as transformers computes them."""
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        kind = (self.cfg.rope_scaling or {}).get("rope_type", (self.cfg.rope_scaling or {}).get("type", "default"))
        if kind not in STATIC_ROPE:
            raise ValueError(f"rope type {kind!r}: svt's heads support {', '.join(STATIC_ROPE)}")
        rot = LlamaRotaryEmbedding(self.config)
        self.register_buffer("inv_freq", rot.inv_freq.detach().clone().float(), persistent=False)
        self.rope_scale = float(rot.attention_scaling)

    def _attention(self) -> nn.Module:  # pragma: no cover - every head defines it
        raise NotImplementedError

    def _qkv(self, x: torch.Tensor, positions: torch.Tensor):
        a, c = self._attention(), self.cfg
        B, T, _ = x.shape
        q = a.q_proj(x).view(B, T, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = a.k_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = a.v_proj(x).view(B, T, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        cos, sin = rope_tables(positions, self.inv_freq, self.rope_scale, q.dtype)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    # -- inference with a KV cache ------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor, cache, last_only: bool = False, **_) -> HeadOutput:
        """Append ``T`` slots per row: ``input_ids`` [B, T], ``features`` [B, T, H] (already fused),
        ``attention_mask`` [B, S] over past and new slots (0 = hole; causal among the new ones) or
        [B, T, S] (what each new slot attends to, e.g. its ancestors in a draft tree),
        ``position_ids`` [B, T].
        ``last_only``: the outputs of the last slot only (a catch-up's earlier slots only fill the
        cache: no LM head over a whole prompt)."""
        x, residual = self._inputs(input_ids, features)
        q, k, v = self._qkv(x, position_ids)
        keys, values = cache.layers[0].update(k, v)
        S, T = attention_mask.shape[-1], input_ids.shape[1]
        if attention_mask.dim() == 3:  # [B, T, S]: each new slot's own allowed slots (draft trees)
            mask = attention_mask.bool()[:, None]
        else:
            mask = attention_mask.bool()[:, None, None, :]
        if T > 1 and attention_mask.dim() == 2:  # a single new slot sees every live slot: no causal part
            causal = torch.arange(S, device=q.device)[None, :] <= (S - T + torch.arange(T, device=q.device))[:, None]
            mask = mask & causal[None, None]
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        if rep > 1:
            keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        if last_only:
            attn, residual = attn[:, :, -1:], residual[:, -1:]
        return self._finish(attn, residual)

    # -- training-time test -------------------------------------------------------------------
    def ttt(self, tokens: torch.Tensor, fused: torch.Tensor, steps: int, logits: bool = True,
            start: int = 0) -> list[HeadOutput]:
        """Every chain unrolled ``steps`` deep at once (training-time test).

        ``tokens`` [B, n] and ``fused`` [B, n, H] (the fused target feature of each token). Chain
        ``i`` starts at position ``i`` (feature of ``t_i``, token ``t_{i+1}``); its step ``k`` sits
        at position ``i + k``, reads token ``t_{i+1+k}`` and step ``k - 1``'s output feature, and
        attends to the step-0 slots ``0..i`` plus its own steps ``1..k``: exactly what the engine's
        KV cache holds when it drafts from position ``i``. Output ``k`` [B, n - 1, ...] predicts
        ``t_{i+2+k}``; entries whose token runs past the window read padding (mask them in a loss).
        ``logits=False`` leaves each output's logits None (:meth:`logits_of` its ``last_hidden`` where
        they are wanted: the LM head is most of an unroll's work). ``start``: only the chains from
        position ``start`` on are wanted (every output covers ``start .. n - 2``): step 0 still runs
        over every position, whose keys and values the chains attend to, the later steps over the
        wanted chains only (a reference run's decode positions, not its prompt's).
        """
        B, n = tokens.shape
        L = n - 1
        pos = torch.arange(L, device=tokens.device)[None, :].expand(B, L)
        pad = tokens.new_full((B, steps), self.cfg.pad_token_id)
        ext = torch.cat([tokens, pad], 1)
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        causal = torch.ones(L, L, dtype=torch.bool, device=tokens.device).tril()
        scale = self.cfg.head_dim ** -0.5
        outs, feature, k0 = [], fused[:, :L], None
        diag_k, diag_v = [], []
        for step in range(steps):
            lo = 0 if step == 0 else start
            x, residual = self._inputs(ext[:, 1 + step + lo : 1 + step + L], feature)
            q, k, v = self._qkv(x, pos[:, lo:] + step)
            if rep > 1:
                k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            if step == 0:
                k0, v0 = k, v
                attn = F.scaled_dot_product_attention(q, k0, v0, attn_mask=causal)
            else:
                diag_k.append(k)
                diag_v.append(v)
                s0 = (q @ k0.transpose(-1, -2)).float() * scale  # scores and softmax in float32, as SDPA
                s0 = s0.masked_fill(~causal[start:], float("-inf"))
                sd = torch.stack([(q * kk).sum(-1) for kk in diag_k], -1).float() * scale  # [B, h, L', step]
                w = torch.cat([s0, sd], -1).softmax(-1).to(v0.dtype)
                attn = w[..., :L] @ v0 + (w[..., L:, None] * torch.stack(diag_v, -2)).sum(-2)
            o = self._finish(attn, residual, logits)
            if step == 0 and start:
                o = HeadOutput(None if o.logits is None else o.logits[:, start:], o.hidden[:, start:],
                               o.last_hidden[:, start:])
            outs.append(o)
            feature = o.hidden
        return outs


class Eagle3Head(HiddenStateHead):
    """The head; ``embed`` is the target's input embedding when the checkpoint ships none."""

    kind = "eagle3"

    def __init__(self, config: Eagle3Config, embed: nn.Embedding | None = None):
        super().__init__()
        c = self.cfg = config
        self.config = config.llama_config()
        self.embed_tokens = embed if embed is not None else nn.Embedding(c.vocab_size, c.hidden_size)
        self.shared_embedding = embed is not None
        self.fc = nn.Linear(len(c.aux_layer_ids) * c.target_hidden_size, c.hidden_size, bias=False)
        self.midlayer = _MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self._init_rope()

    # -- pieces -------------------------------------------------------------------------------
    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """The fused feature from the concatenated taps [..., 3 * H_t]."""
        return self.fc(taps)

    def full_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits scattered into the target's vocabulary (-inf elsewhere)."""
        V, Vd = self.cfg.vocab_size, self.cfg.draft_vocab_size
        if Vd == V and not bool(self.d2t.any()):
            return draft_logits
        out = draft_logits.new_full((*draft_logits.shape[:-1], V), float("-inf"))
        out[..., torch.arange(Vd, device=self.d2t.device) + self.d2t] = draft_logits
        return out

    def _inputs(self, ids: torch.Tensor, feature: torch.Tensor):
        """(2H attention input, residual) for tokens ``ids`` [B, T] and features [B, T, H]."""
        m = self.midlayer
        emb = m.input_layernorm(self.embed_tokens(ids))
        normed = m.hidden_norm(feature)
        residual = normed if self.cfg.norm_before_residual else feature
        return torch.cat([emb, normed], -1), residual

    def _attention(self) -> nn.Module:
        return self.midlayer.self_attn

    def _finish(self, attn: torch.Tensor, residual: torch.Tensor, logits: bool = True) -> HeadOutput:
        """``attn`` [B, h, T, d] -> logits (None unless ``logits``) and features."""
        m = self.midlayer
        B, _, T, _ = attn.shape
        r = m.self_attn.o_proj(attn.transpose(1, 2).reshape(B, T, -1)) + residual
        hidden = m.mlp(m.post_attention_layernorm(r)) + r
        last = self.norm(hidden)
        return HeadOutput(self.logits_of(last) if logits else None, hidden, last)

    def logits_of(self, last_hidden: torch.Tensor) -> torch.Tensor:
        """The LM head over normed outputs, in the target's vocabulary."""
        return self.full_logits(self.lm_head(last_hidden))


# -- the published directory form ----------------------------------------------------------------
def published_state(head: Eagle3Head) -> dict[str, torch.Tensor]:
    """The head's weights under the published names (``embed_tokens`` only when it owns one; ``d2t``
    only for a reduced draft vocabulary: vLLM 0.32's loader refuses a ``d2t`` on a full-vocabulary
    head, whose draft ids are the target's)."""
    out = {}
    full = head.cfg.draft_vocab_size == head.cfg.vocab_size and not bool(head.d2t.any())
    for name, t in head.state_dict().items():
        if (name.startswith("embed_tokens") and head.shared_embedding) or (name == "d2t" and full):
            continue
        out[name] = t.contiguous()
    return out


def save_head(head: Eagle3Head, path: Path, dtype: torch.dtype = torch.bfloat16, extra: dict | None = None) -> None:
    """``config.json`` + ``model.safetensors`` in the published EAGLE-3 form."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    state = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in published_state(head).items()}
    save_file(state, path / "model.safetensors", metadata={"format": "pt"})
    cfg = head.cfg.to_hf()
    cfg["torch_dtype"] = str(dtype).removeprefix("torch.")
    cfg.update(extra or {})
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def is_eagle3_dir(path: Path) -> bool:
    """Whether ``path/config.json`` names an EAGLE-3 architecture."""
    return any(a in ARCHITECTURES for a in config_architectures(path))


def config_architectures(path: Path) -> list:
    """``architectures`` of ``path/config.json`` (empty when it is unreadable or not a list)."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return []
    arch = cfg.get("architectures") if isinstance(cfg, dict) else None
    return arch if isinstance(arch, list) else []
