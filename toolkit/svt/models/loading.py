"""Load a target/draft pair of Hugging Face causal LMs from local paths (never from a hub)."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from svt.devices import resolve_device  # noqa: F401  (re-exported: svt.models.resolve_device)
from svt.errors import ModelLoadError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` -> float32 on CPU (exact and, at tiny sizes, as fast), bfloat16 on CUDA."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ModelLoadError(
            f"Expected `dtype` to be one of auto, {', '.join(DTYPES)}, but got {dtype!r}."
        ) from None


def weights_hash(path: Path) -> str:
    """sha256 over the model's weight files (sorted by name), first 16 hex digits."""
    h = hashlib.sha256()
    files = sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin"))
    for f in files:
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def config_hash(path: Path) -> str | None:
    """sha256 of a model's config.json as parsed (key order and the writer's transformers version
    left out), first 16 hex digits; None when it cannot be read. A head's taps, rope and norms live
    there, so two heads with equal weights and another config draft differently."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    cfg = {k: v for k, v in cfg.items() if k not in ("transformers_version", "_name_or_path")}
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def check_model_dir(path: Path, role: str) -> None:
    if not path.is_dir():
        raise ModelLoadError(f"Expected the {role} model at a local directory, but {str(path)!r} is not one.")
    if not (path / "config.json").is_file():
        raise ModelLoadError(
            f"Expected a Hugging Face model directory with config.json for the {role}, "
            f"but {str(path)!r} has none."
        )


@dataclass
class ModelPair:
    """A loaded target and draft sharing one tokenizer."""

    target: Any
    draft: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    target_path: Path
    draft_path: Path

    @property
    def draft_kind(self) -> str:
        """``model`` (a separate causal LM), a head over the target's hidden states (``eagle3``,
        ``mtp``) or a block-parallel drafter over them (``dflash``, ``dspark``)."""
        from svt.models.block import BlockDrafter
        from svt.models.eagle3 import HiddenStateHead

        return self.draft.kind if isinstance(self.draft, (HiddenStateHead, BlockDrafter)) else "model"

    def identity(self) -> dict:
        """What run.json records about the pair (a head's parameters exclude a shared embedding)."""
        block = self.draft_kind in ("dflash", "dspark")
        own = self.draft.own_parameters() if block else [
            p for n, p in self.draft.named_parameters()
            if not (self.draft_kind != "model" and self.draft.shared_embedding and n.startswith("embed_tokens"))
            and not n.startswith("shared_head.head")]
        from svt.models.lean import forward_name

        draft = {"path": str(self.draft_path), "weights_sha256_16": weights_hash(self.draft_path),
                 "config_sha256_16": config_hash(self.draft_path),
                 "parameters": sum(p.numel() for p in own), "kind": self.draft_kind,
                 "forward": forward_name(self.draft)}
        if self.draft_kind != "model":
            draft["aux_layer_ids"] = list(self.draft.cfg.aux_layer_ids)
            draft["draft_vocab_size"] = getattr(self.draft.cfg, "draft_vocab_size", self.draft.cfg.vocab_size)
        if block:
            draft["layout"] = {"block_size": self.draft.cfg.block_size, "mask_token_id": self.draft.cfg.mask_token_id,
                               "target_layer_ids": list(self.draft.cfg.target_layer_ids),
                               "sample_from_anchor": self.draft.cfg.sample_from_anchor,
                               "markov_rank": self.draft.cfg.markov_rank,
                               "confidence_head": self.draft.cfg.enable_confidence_head}
        return {
            "target": {"path": str(self.target_path), "weights_sha256_16": weights_hash(self.target_path),
                       "config_sha256_16": config_hash(self.target_path),
                       "parameters": sum(p.numel() for p in self.target.parameters()),
                       "forward": forward_name(self.target)},
            "draft": draft,
            "tokenizer": {"path": str(self.target_path), "vocab_size": len(self.tokenizer)},
            "dtype": str(self.dtype).removeprefix("torch."),
        }


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def load_tokenizer(path: str | Path):
    """The tokenizer of a local model directory."""
    _offline()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(Path(path), local_files_only=True)
    except Exception as exc:  # transformers raises many types here
        raise ModelLoadError(f"Could not load the tokenizer from {str(path)!r}: {exc}") from None


def check_draft_tokenizer(tokenizer, target_path: Path, draft_path: Path) -> None:
    """The draft's own tokenizer (when it ships one) must be the target's."""
    if (draft_path / "tokenizer.json").is_file() or (draft_path / "tokenizer_config.json").is_file():
        draft_tok = load_tokenizer(draft_path)
        if draft_tok.get_vocab() != tokenizer.get_vocab():
            raise ModelLoadError(
                f"Expected the target and draft to share one tokenizer, but {str(target_path)!r} "
                f"and {str(draft_path)!r} have different vocabularies "
                f"({len(tokenizer)} vs {len(draft_tok)} tokens)."
            )


def load_causal_lm(path: Path, role: str, dev: torch.device, dt: torch.dtype, attn_implementation: str = "sdpa"):
    """``AutoModelForCausalLM.from_pretrained`` from a local directory, on ``dev`` in eval mode."""
    _offline()
    from transformers import AutoModelForCausalLM

    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            path, dtype=dt, local_files_only=True, attn_implementation=attn_implementation, output_loading_info=True
        )
    except Exception as exc:
        raise ModelLoadError(f"Could not load the {role} model from {str(path)!r}: {exc}") from None
    check_loading_info(info, role, path)
    return model.to(dev).eval()


def check_loading_info(info: dict, role: str, path: Path) -> None:
    """A checkpoint that does not fill its model exactly is refused: transformers would initialise
    missing weights at random (a config claiming more layers than the weights hold) and drop
    unexpected ones (another architecture's weights), and the run would be filed under the
    directory's weights hash as if it were that model."""
    problems = []
    for key, what in (("missing_keys", "missing from the weights (they would be random)"),
                      ("unexpected_keys", "in the weights but not in the model"),
                      ("mismatched_keys", "of another shape than the config says")):
        keys = sorted(str(k) for k in (info.get(key) or ()))
        if keys:
            problems.append(f"{len(keys)} {what}: {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}")
    if problems:
        raise ModelLoadError(f"The {role} checkpoint {str(path)!r} does not match its config.json: "
                             + "; ".join(problems) + ".")


def load_pair(target_path: str | Path, draft_path: str | Path, *, device: str = "auto",
              dtype: str = "auto", attn_implementation: str = "sdpa") -> ModelPair:
    """Load target and draft with ``AutoModelForCausalLM.from_pretrained`` from local directories.

    A draft directory whose ``config.json`` names an EAGLE-3 or svt's MTP architecture is loaded as a
    hidden-state head over the target (:func:`svt.models.heads.load_head`).

    The tokenizer comes from the target's directory; the draft's (when it has one) must have the
    same vocabulary, and both models' output vocabularies must cover it.
    """
    target_path, draft_path = Path(target_path), Path(draft_path)
    check_model_dir(target_path, "target")
    check_model_dir(draft_path, "draft")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    from svt.models.heads import is_head_dir, load_head

    if is_head_dir(target_path):
        raise ModelLoadError(f"The target {str(target_path)!r} is a hidden-state head (EAGLE-3 or MTP): a head drafts "
                             "for a target; pass it as `draft` and its target model as `target`.")
    tokenizer = load_tokenizer(target_path)
    if is_head_dir(draft_path):  # a hidden-state head: it reads the target, shares its tokenizer

        target = load_causal_lm(target_path, "target", dev, dt, attn_implementation)
        if len(tokenizer) > target.config.vocab_size:
            raise ModelLoadError(f"The tokenizer has {len(tokenizer)} tokens but the target only "
                                 f"{target.config.vocab_size}.")
        check_bound(draft_path, target_path)
        head = load_head(draft_path, target, device=dev, dtype=dt)
        return ModelPair(target, head, tokenizer, dev, dt, target_path, draft_path)
    check_draft_tokenizer(tokenizer, target_path, draft_path)
    models = [load_causal_lm(path, role, dev, dt, attn_implementation)
              for path, role in ((target_path, "target"), (draft_path, "draft"))]
    target, draft = models
    vt, vd = target.config.vocab_size, draft.config.vocab_size
    if vt != vd:
        raise ModelLoadError(
            f"Expected target and draft to have the same output vocabulary, but got {vt} and {vd}."
        )
    if len(tokenizer) > vt:
        raise ModelLoadError(f"The tokenizer has {len(tokenizer)} tokens but the models only {vt}.")
    return ModelPair(target, draft, tokenizer, dev, dt, target_path, draft_path)


def check_bound(draft_path: Path, target_path: Path) -> None:
    """A drafter svt trained records its target's weights hash (``svt_target_weights_sha256_16`` in
    its config.json); another target is refused by name (a drafter reads its own target's hidden
    states: on another target of the same shape it drafts, silently, nothing the target accepts)."""
    try:
        bound = json.loads((Path(draft_path) / "config.json").read_text()).get("svt_target_weights_sha256_16")
    except (OSError, ValueError, AttributeError):
        return
    if bound and weights_hash(Path(target_path)) != bound:
        raise ModelLoadError(f"{draft_path}: this drafter was trained on a target with weights {bound}; the target "
                             f"at {target_path} has {weights_hash(Path(target_path))}. A drafter reads its own "
                             "target's hidden states: train one for this target.")
