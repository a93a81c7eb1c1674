"""A multi-token-prediction (MTP) head in DeepSeek-V3's form, for a target that ships none.

DeepSeek-V3 (DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024) predicts further tokens with MTP
modules; vLLM's ``deepseek_mtp`` runs one as a drafter:

- the next token's embedding and the target's final hidden state (after its final norm), each
  RMS-normed (``enorm``, ``hnorm``), concatenated and projected ``2H -> H`` (``eh_proj``);
- one ordinary decoder layer (``input_layernorm``, ``self_attn``, ``post_attention_layernorm``,
  ``mlp``) whose output plus residual is the next step's feature;
- ``shared_head.norm`` and the target's own output head (``shared_head.head``: shared, not saved).

Against EAGLE-3 (:mod:`svt.models.eagle3`) it reads one hidden state (the target's last, tap id
``L`` = transformers' ``hidden_states[L]``) instead of three fused ones, and its layer's attention
takes the projected ``H`` instead of ``2H``. The engine, the training-time test and the training
are the same (:class:`svt.models.eagle3.HiddenStateHead`).

Saved as a directory of its own: ``config.json`` (``architectures: ["SvtLlamaMTP"]``,
``num_nextn_predict_layers: 1``, ``mtp_target_layer_id``) and ``model.safetensors`` with the MTP
layer's DeepSeek-V3 names without the ``model.layers.{L}.`` prefix. vLLM serves MTP only for model
families that ship such layers inside the target's checkpoint (DeepSeek, Qwen3-Next, ...), so this
directory is svt's; a DeepSeek-V3 checkpoint's MTP layer is these tensors under that prefix.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from svt.models.eagle3 import (
    Eagle3Config,
    GatedMLP,
    HeadOutput,
    HiddenStateHead,
    RMSNorm,
    config_architectures,
)

ARCHITECTURE = "SvtLlamaMTP"


class _SelfAttention(nn.Module):
    def __init__(self, c: Eagle3Config):
        super().__init__()
        hd = c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * hd, c.hidden_size, bias=False)


class _SharedHead(nn.Module):
    def __init__(self, c: Eagle3Config, head: nn.Module):
        super().__init__()
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.head = head


class MTPHead(HiddenStateHead):
    """One MTP layer over the target's final hidden state; ``embed`` and ``lm_head`` are the
    target's (shared)."""

    kind = "mtp"

    def __init__(self, config: Eagle3Config, embed: nn.Embedding, lm_head: nn.Module):
        super().__init__()
        c = self.cfg = config
        self.config = config.llama_config()
        self.embed_tokens = embed
        self.shared_embedding = True
        self.enorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hnorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * c.hidden_size, c.hidden_size, bias=False)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = _SelfAttention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = GatedMLP(c)
        self.shared_head = _SharedHead(c, lm_head)
        self._init_rope()

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """The target's final hidden state is the feature as it is."""
        return taps

    def _inputs(self, ids: torch.Tensor, feature: torch.Tensor):
        x = self.eh_proj(torch.cat([self.enorm(self.embed_tokens(ids)), self.hnorm(feature)], -1))
        return self.input_layernorm(x), x

    def _attention(self) -> nn.Module:
        return self.self_attn

    def _finish(self, attn: torch.Tensor, residual: torch.Tensor, logits: bool = True) -> HeadOutput:
        B, _, T, _ = attn.shape
        r = self.self_attn.o_proj(attn.transpose(1, 2).reshape(B, T, -1)) + residual
        hidden = self.mlp(self.post_attention_layernorm(r)) + r
        last = self.shared_head.norm(hidden)
        return HeadOutput(self.logits_of(last) if logits else None, hidden, last)

    def logits_of(self, last_hidden: torch.Tensor) -> torch.Tensor:
        return self.shared_head.head(last_hidden)


def own_state(head: MTPHead) -> dict[str, torch.Tensor]:
    """The MTP layer's own weights (the shared embedding and output head left out)."""
    return {k: v.contiguous() for k, v in head.state_dict().items()
            if not k.startswith("embed_tokens") and not k.startswith("shared_head.head")}


def mtp_config_dict(head: MTPHead) -> dict:
    c = head.cfg
    return {"architectures": [ARCHITECTURE], "model_type": "llama", "mtp_form": "DeepSeek-V3",
            "rope_scaling": c.rope_scaling,
            "num_nextn_predict_layers": 1, "mtp_target_layer_id": int(c.aux_layer_ids[0]),
            "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
            "head_dim": c.head_dim, "vocab_size": c.vocab_size, "rms_norm_eps": c.rms_norm_eps,
            "rope_theta": c.rope_theta, "max_position_embeddings": c.max_position_embeddings,
            "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id, "pad_token_id": c.pad_token_id}


def save_mtp(head: MTPHead, path: Path, dtype: torch.dtype = torch.bfloat16, extra: dict | None = None) -> None:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.to(dtype) for k, v in own_state(head).items()}, path / "model.safetensors",
              metadata={"format": "pt"})
    cfg = {**mtp_config_dict(head), "torch_dtype": str(dtype).removeprefix("torch."), **(extra or {})}
    (path / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def is_mtp_dir(path: Path) -> bool:
    return ARCHITECTURE in config_architectures(path)
