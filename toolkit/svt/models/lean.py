"""A lean forward pass for Llama-family causal LMs: the same weights and the same arithmetic as
transformers' ``LlamaForCausalLM`` with SDPA attention, without its per-call machinery.

transformers 5 builds a 4D mask through its mask utilities, records hidden states with hooks,
goes through a decorator stack and a module call per norm, projection and layer on every forward.
For the small models speculative decoding drafts with, and for a target verifying a few tokens a
row, that machinery is most of the time: on this 2-core CPU a draft-large forward of one token for
8 rows takes 1.47 ms through transformers and 0.91 ms here, a target forward of 6 tokens for one
row 2.19 ms and 1.42 ms (the median of 5 x 200 forwards, over a 200-slot cache with holes).

What is the same, operation for operation: the embedding; each layer's RMSNorm as transformers
writes it (float32 variance, ``rsqrt``, weight times the input dtype); the q/k/v projections (three
matmuls, no fused copy of the weights: a model's memory is not doubled), the rotary embedding from
the model's own ``rotary_emb`` (its ``inv_freq`` and scaling), the cache's ``update``, grouped
heads repeated as ``repeat_kv`` does, ``scaled_dot_product_attention`` with the boolean mask as SDPA itself turns it into an additive one, and the
model's scale, the output projection, the SiLU-gated MLP, the final norm and the LM head. The mask
is causal over cache slots and the 2D padding mask (or a caller's own 4D additive mask, as a draft
tree's, used as given), and each query also sees its own slot: a slot
every row masks (a hole the engine will never unmask) then attends to itself instead of to nothing,
so its keys and values stay finite; no real query ever sees it. ``hidden_states``, when asked for,
is transformers' tuple: the embeddings, each layer's input after the first, and the final norm's
output. Tests hold the logits and every hidden state equal to transformers' to 1e-6 in float32 (bit for
bit for the built-in models on this CPU; grouped heads differ in the last bits), through caches with
holes, compaction and rows leaving. The layers are taken when the lean forward is first built: change
``num_hidden_layers`` after that and build a new model.

Only configurations whose forward is exactly this are taken (:func:`why_not_lean` says why not
otherwise, and the engine then calls the model itself): a ``LlamaForCausalLM`` with SDPA attention,
no biases, SiLU, ``pretraining_tp`` 1, no sliding window, rotary frequencies fixed at load (default,
linear or llama3 RoPE). ``SVT_FORWARD=transformers`` in the
environment turns it off (run.json's ``models.*.forward`` says which ran).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class LeanOutput:
    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None


def why_not_lean(model) -> str | None:
    """Why ``model``'s forward is not the lean one (None: it is)."""
    from transformers import LlamaForCausalLM

    if os.environ.get("SVT_FORWARD", "lean") == "transformers":
        return "SVT_FORWARD=transformers asks for transformers' own forward"
    if not isinstance(model, LlamaForCausalLM):
        return "not a transformers Llama causal LM"
    cfg = model.config
    checks = {"attention": getattr(cfg, "_attn_implementation", None) == "sdpa",
              "attention_bias": not getattr(cfg, "attention_bias", False),
              "mlp_bias": not getattr(cfg, "mlp_bias", False),
              "hidden_act": getattr(cfg, "hidden_act", None) == "silu",
              "pretraining_tp": getattr(cfg, "pretraining_tp", 1) == 1,
              "sliding_window": getattr(cfg, "sliding_window", None) is None,
              # rotary frequencies fixed at load (dynamic and long-rope types move them per forward)
              "rope_type": ((getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
                            in ("default", "linear", "llama3")),
              "lm_head": hasattr(model, "lm_head") and getattr(model.lm_head, "bias", None) is None}
    failed = [k for k, ok in checks.items() if not ok]
    return f"its config differs in {', '.join(failed)}" if failed else None


class LeanLlama:
    """Call it as the engine calls a transformers model (see the module)."""

    def __init__(self, model):
        self.model = model
        self.config = model.config
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.rotary = inner.rotary_emb
        self.layers = [(layer.input_layernorm, layer.self_attn, layer.post_attention_layernorm, layer.mlp)
                       for layer in inner.layers[: model.config.num_hidden_layers]]
        self.norm = inner.norm
        self.head = model.lm_head.weight
        self.n_heads = model.config.num_attention_heads
        self.n_kv = model.config.num_key_value_heads

    def parameters(self):
        return self.model.parameters()

    def __call__(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, cache=None,
                 use_cache=True, output_hidden_states=False, **other) -> LeanOutput:
        if other:  # e.g. logits_to_keep: never ignored in silence
            raise TypeError(f"the lean forward does not take {', '.join(sorted(other))}; call the model itself")
        cache = cache if cache is not None else past_key_values
        if cache is None:
            raise ValueError("the lean forward appends to a cache: pass cache= (or past_key_values=)")
        B, T = input_ids.shape
        past = cache.get_seq_length()
        S = past + T
        dev = input_ids.device
        if attention_mask is None:
            attention_mask = torch.ones((B, S), dtype=torch.long, device=dev)
        if position_ids is None:
            position_ids = (past + torch.arange(T, device=dev))[None].expand(B, -1)
        h = F.embedding(input_ids, self.embed)
        cos, sin = self._rotary(position_ids, h.dtype)
        # a caller's own additive mask ``[B, 1, T, S]`` (draft trees: each node sees its ancestors) is
        # used as given, as transformers does with a 4D mask
        mask = attention_mask.to(h.dtype) if attention_mask.dim() == 4 else additive_mask(attention_mask, T, h.dtype)
        states = [h] if output_hidden_states else None
        for i, (norm1, attn, norm2, mlp) in enumerate(self.layers):
            h = h + self._attention(_rms(norm1, h), attn, cos, sin, mask, cache, i)
            x = _rms(norm2, h)
            h = h + F.linear(F.silu(F.linear(x, mlp.gate_proj.weight)) * F.linear(x, mlp.up_proj.weight),
                             mlp.down_proj.weight)
            if states is not None and i < len(self.layers) - 1:
                states.append(h)
        h = _rms(self.norm, h)
        if states is not None:
            states.append(h)
        return LeanOutput(F.linear(h, self.head), tuple(states) if states is not None else None)

    def _rotary(self, position_ids, dtype):
        """cos and sin ``[B, 1, T, head_dim]`` as the model's ``rotary_emb`` computes them (its
        float32 outer product of positions and ``inv_freq`` has one product per entry, so the
        elementwise product here is the same number), without its module call and autocast context."""
        freqs = position_ids[:, :, None].float() * self.rotary.inv_freq.float()[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = self.rotary.attention_scaling
        return (emb.cos() * scale).to(dtype)[:, None], (emb.sin() * scale).to(dtype)[:, None]

    def _attention(self, x, attn, cos, sin, mask, cache, i):
        B, T, _ = x.shape
        d = attn.head_dim
        q = F.linear(x, attn.q_proj.weight).view(B, T, -1, d).transpose(1, 2)
        k = F.linear(x, attn.k_proj.weight).view(B, T, -1, d).transpose(1, 2)
        v = F.linear(x, attn.v_proj.weight).view(B, T, -1, d).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k, v = cache.update(k, v, i)
        groups = self.n_heads // self.n_kv
        if groups > 1:  # transformers' repeat_kv
            k, v = (t[:, :, None].expand(-1, -1, groups, -1, -1).reshape(B, self.n_heads, -1, d) for t in (k, v))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, scale=attn.scaling)
        return F.linear(o.transpose(1, 2).reshape(B, T, -1), attn.o_proj.weight)


def additive_mask(attention_mask: torch.Tensor, T: int, dtype) -> torch.Tensor:
    """``[B, 1, T, S]``: 0 where the last ``T`` slots' queries attend, -inf elsewhere: causal over
    cache slots and the 2D ``attention_mask`` ``[B, S]``, and each query always its own slot (a
    query every row masks then attends to itself, never to nothing: attention kernels that give NaN
    for an empty row would write NaN keys into the cache). Built once for every layer (SDPA turns a
    boolean mask into this on each call: the same numbers)."""
    S = attention_mask.shape[1]
    dev = attention_mask.device
    slot = torch.arange(S, device=dev)[None, :]
    query_slot = (S - T + torch.arange(T, device=dev))[:, None]
    mask = ((slot <= query_slot)[None] & attention_mask[:, None, :].bool()) | (slot == query_slot)[None]
    return torch.zeros(mask.shape, dtype=dtype, device=dev).masked_fill_(~mask, float("-inf"))[:, None]


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def _rms(norm, h):
    """transformers' LlamaRMSNorm, written out (no module call)."""
    x = h.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * x.to(h.dtype)


def forward_name(model) -> str:
    """What run.json records as the forward that ran ``model``."""
    if why_not_lean(model) is None:
        return "svt lean llama"
    return "transformers" if hasattr(model, "generate") else "svt"


def lean_forward(model):
    """The lean forward of ``model`` when its configuration is one (else None), built once per model."""
    if why_not_lean(model) is not None:
        return None
    lean = model.__dict__.get("_svt_lean")
    if lean is None:
        lean = LeanLlama(model)
        model.__dict__["_svt_lean"] = lean
    return lean
