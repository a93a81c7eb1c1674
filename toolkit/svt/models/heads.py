"""Load a published EAGLE-3 head directory against its target, as vLLM reads one.

``config.json``: ``architectures`` naming an EAGLE-3 Llama head, ``hidden_size``, ``vocab_size``
(the target's), ``draft_vocab_size`` (``vocab_size`` when absent), ``target_hidden_size``
(``hidden_size`` when absent), ``eagle_aux_hidden_state_layer_ids`` (at the top level or in
``eagle_config``; vLLM's default ``(2, L // 2, L - 3)`` with a warning when absent),
``norm_before_residual``. Weights (``*.safetensors`` or ``pytorch_model.bin``): ``fc.weight``,
``midlayer.*``, ``norm.weight``, ``lm_head.weight``, optional ``d2t`` (draft id -> target id offset;
``t2d`` is read and ignored, as vLLM does) and optional ``embed_tokens.weight`` (else the target's
embedding is shared). Every mismatch with the target is one :class:`ModelLoadError` naming the field.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

from svt.errors import ModelLoadError
from svt.models.eagle3 import ARCHITECTURES, Eagle3Config, Eagle3Head


def default_aux_layers(n_layers: int) -> tuple[int, ...]:
    """vLLM's default EAGLE-3 tap ids for an ``n_layers`` target (broken for tiny targets)."""
    return (2, n_layers // 2, n_layers - 3)


def _read_config(path: Path) -> dict:
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"Could not read the head's config {str(path / 'config.json')!r}: {exc}") from None
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"Expected {str(path / 'config.json')!r} to hold a JSON object.")
    return cfg


def _field(cfg: dict, name: str, path: Path, kind=int, default=None):
    value = cfg.get(name, default)
    if value is None or isinstance(value, bool) or not isinstance(value, kind) or (kind is int and value <= 0):
        raise ModelLoadError(f"Expected `{name}` in {str(path / 'config.json')!r} to be a positive "
                             f"{kind.__name__}, but got {value!r}.")
    return value


def _positive(cfg: dict, name: str, path: Path, default: float) -> float:
    """A positive real number field (``rms_norm_eps``, ``rope_theta``): ints and floats, no bools."""
    value = cfg.get(name)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or value != value:
        raise ModelLoadError(f"Expected `{name}` in {str(path / 'config.json')!r} to be a positive number, "
                             f"but got {value!r}.")
    return float(value)


def _common(cfg: dict, path: Path) -> dict:
    """The fields both head kinds read beside their shapes, checked."""
    if cfg.get("hidden_act", "silu") != "silu":
        raise ModelLoadError(f"Expected `hidden_act` in {str(path / 'config.json')!r} to be 'silu' (svt's heads run "
                             f"a SiLU MLP), but got {cfg.get('hidden_act')!r}.")
    nbr = cfg.get("norm_before_residual", False)
    if not isinstance(nbr, bool):
        raise ModelLoadError(f"Expected `norm_before_residual` in {str(path / 'config.json')!r} to be true or false, "
                             f"but got {nbr!r}.")
    params = cfg.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise ModelLoadError(f"Expected `rope_parameters` in {str(path / 'config.json')!r} to be a mapping, "
                             f"but got {params!r}.")
    theta = cfg.get("rope_theta") if cfg.get("rope_theta") is not None else (params or {}).get("rope_theta")
    ids = {}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = cfg.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ModelLoadError(f"Expected `{name}` in {str(path / 'config.json')!r} to be a token id, but got {v!r}.")
        ids[name] = v or 0
    return {"rms_norm_eps": _positive(cfg, "rms_norm_eps", path, 1e-6),
            "rope_theta": _positive({"rope_theta": theta}, "rope_theta", path, 10000.0),
            "max_position_embeddings": _field(cfg, "max_position_embeddings", path, default=2048),
            "norm_before_residual": nbr, "rope_scaling": _rope_scaling(cfg, path), **ids}


def _check_heads(cfg: dict, path: Path, H: int, heads: int, kv: int) -> None:
    if H % heads or heads % kv:
        raise ModelLoadError(f"Expected `hidden_size` ({H}) divisible by `num_attention_heads` ({heads}) and "
                             f"that by `num_key_value_heads` ({kv}) in {str(path / 'config.json')!r}.")
    if "head_dim" in cfg and cfg["head_dim"] not in (None, H // heads):
        raise ModelLoadError(f"Expected `head_dim` = hidden_size / num_attention_heads = {H // heads}, but got "
                             f"{cfg['head_dim']!r} in {str(path / 'config.json')!r}.")


def _check_state(state: dict, expected: dict, path: Path, kind: str, optional: frozenset | set = frozenset()) -> None:
    """Every expected tensor present (``optional`` ones may be absent), none unexpected, each of its
    expected shape."""
    missing = sorted(set(expected) - set(state) - set(optional))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ModelLoadError(f"The {kind} head's weights in {str(path)!r} do not fit its config: "
                             + "; ".join(s for s in (f"missing {', '.join(missing)}" if missing else "",
                                                     f"unexpected {', '.join(unexpected)}" if unexpected else "") if s))
    for k, v in state.items():
        if tuple(v.shape) != tuple(expected[k]):
            raise ModelLoadError(f"The {kind} head's `{k}` in {str(path)!r} has shape {list(v.shape)}, but its "
                                 f"config needs {list(expected[k])}.")


def _build(make, path: Path):
    """Construct a head, turning transformers' refusal of its rope settings into one message."""
    try:
        return make()
    except (KeyError, ValueError, TypeError) as exc:
        raise ModelLoadError(f"The head at {str(path)!r} has rotary settings transformers refuses "
                             f"(`rope_scaling`): {str(exc).splitlines()[0]}") from None


def _rope_scaling(cfg: dict, path: Path) -> dict | None:
    """The head's rotary scaling (``rope_scaling``, or transformers 5's ``rope_parameters``): None for
    the default; a type whose frequencies change with the sequence length is refused."""
    from svt.models.eagle3 import STATIC_ROPE

    raw = cfg.get("rope_scaling")
    if raw is None and isinstance(cfg.get("rope_parameters"), dict):
        raw = {k: v for k, v in cfg["rope_parameters"].items() if k != "rope_theta"}
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ModelLoadError(f"Expected `rope_scaling` in {str(path / 'config.json')!r} to be a mapping, but got {raw!r}.")
    kind = raw.get("rope_type", raw.get("type", "default"))
    if kind not in STATIC_ROPE:
        raise ModelLoadError(f"The head at {str(path)!r} uses rope type {kind!r}; svt's heads run "
                             f"{', '.join(STATIC_ROPE)} (the frequencies of the others change with the length).")
    return None if kind == "default" else {**raw, "rope_type": kind}


def head_config(path: Path, target_config) -> Eagle3Config:
    """The head's config, checked against the target's (hidden size, vocabulary, tap ids)."""
    cfg = _read_config(path)
    arch = cfg.get("architectures") or []
    if not any(a in ARCHITECTURES for a in arch):
        raise ModelLoadError(f"Expected `architectures` in {str(path / 'config.json')!r} to name one of "
                             f"{', '.join(ARCHITECTURES)}, but got {arch!r}.")
    H = _field(cfg, "hidden_size", path)
    heads = _field(cfg, "num_attention_heads", path)
    kv = _field(cfg, "num_key_value_heads", path, default=heads)
    V = _field(cfg, "vocab_size", path)
    Vd = _field(cfg, "draft_vocab_size", path, default=V)
    Ht = _field(cfg, "target_hidden_size", path, default=H)
    L = int(target_config.num_hidden_layers)
    if cfg.get("num_hidden_layers", 1) != 1:
        raise ModelLoadError(f"Expected `num_hidden_layers` = 1 in {str(path / 'config.json')!r} (svt runs "
                             f"one-layer EAGLE-3 heads), but got {cfg.get('num_hidden_layers')!r}.")
    _check_heads(cfg, path, H, heads, kv)
    if Ht != target_config.hidden_size:
        raise ModelLoadError(f"The EAGLE-3 head at {str(path)!r} reads features of width `target_hidden_size` = "
                             f"{Ht}, but the target's hidden size is {target_config.hidden_size}.")
    if V != target_config.vocab_size:
        raise ModelLoadError(f"The EAGLE-3 head at {str(path)!r} has `vocab_size` = {V}, but the target's "
                             f"vocabulary is {target_config.vocab_size}.")
    if Vd > V:
        raise ModelLoadError(f"Expected `draft_vocab_size` ({Vd}) <= `vocab_size` ({V}) in {str(path)!r}.")
    aux = cfg.get("eagle_aux_hidden_state_layer_ids")
    if aux is None and isinstance(cfg.get("eagle_config"), dict):
        aux = cfg["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
    if aux is None:
        aux = default_aux_layers(L)
        warnings.warn(f"The EAGLE-3 head at {str(path)!r} names no `eagle_aux_hidden_state_layer_ids`; using "
                      f"vLLM's default {list(aux)} for a {L}-layer target.", stacklevel=2)
    if (not isinstance(aux, list | tuple) or len(aux) != 3
            or not all(isinstance(a, int) and not isinstance(a, bool) for a in aux)):
        raise ModelLoadError(f"Expected `eagle_aux_hidden_state_layer_ids` to be three layer ids, but got {aux!r}.")
    if any(not 0 <= a < L for a in aux):
        raise ModelLoadError(f"`eagle_aux_hidden_state_layer_ids` {list(aux)} of {str(path)!r} taps layers "
                             f"beyond the target's: a tap id must be in 0..{L - 1} for a {L}-layer target.")
    if len(set(aux)) != 3:
        warnings.warn(f"The EAGLE-3 head at {str(path)!r} taps the same layer twice: {list(aux)}.", stacklevel=2)
    common = _common(cfg, path)
    known = {"hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
             "draft_vocab_size", "target_hidden_size", "eagle_aux_hidden_state_layer_ids", "rms_norm_eps",
             "rope_theta", "max_position_embeddings", "norm_before_residual", "bos_token_id", "eos_token_id",
             "pad_token_id", "architectures", "model_type", "num_hidden_layers", "hidden_act", "head_dim",
             "rope_parameters",
             "tie_word_embeddings", "rope_scaling", "torch_dtype", "dtype"}
    return Eagle3Config(
        hidden_size=H, intermediate_size=_field(cfg, "intermediate_size", path), num_attention_heads=heads,
        num_key_value_heads=kv, vocab_size=V, draft_vocab_size=Vd, target_hidden_size=Ht,
        aux_layer_ids=tuple(int(a) for a in aux), **common,
        extra={k: v for k, v in cfg.items() if k not in known})


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    try:
        if files:
            from safetensors.torch import load_file

            for f in files:
                part = load_file(f)
                twice = sorted(set(part) & set(state))
                if twice:
                    raise ModelLoadError(f"The head's weight files in {str(path)!r} hold {', '.join(twice[:3])} "
                                         "more than once.")
                state.update(part)
        elif (path / "pytorch_model.bin").is_file():
            state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        else:
            raise ModelLoadError(f"The head at {str(path)!r} has no *.safetensors or pytorch_model.bin.")
    except ModelLoadError:
        raise
    except Exception as exc:
        first = (str(exc).splitlines() or [""])[0]
        raise ModelLoadError(f"Could not read the head's weights in {str(path)!r} ({type(exc).__name__}: "
                             f"{first[:300]})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelLoadError(f"Expected the head's weights in {str(path)!r} to be a mapping of names to tensors.")
    for k, v in state.items():
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            raise ModelLoadError(f"The head's `{k}` in {str(path)!r} holds NaN or infinite values.")
        if not v.is_floating_point() and k != "d2t" and k != "t2d":
            raise ModelLoadError(f"The head's `{k}` in {str(path)!r} is a {v.dtype} tensor; weights are floats.")
    d2t = state.get("d2t")
    if d2t is not None and d2t.is_floating_point():
        raise ModelLoadError(f"The head's `d2t` in {str(path)!r} holds floats; it is a table of integer offsets.")
    return state


def load_eagle3(path: str | Path, target, *, device=None, dtype=None) -> Eagle3Head:
    """The head at ``path`` for ``target`` (a loaded transformers causal LM), in eval mode."""
    path = Path(path)
    cfg = head_config(path, target.config)
    state = _read_weights(path)
    state.pop("t2d", None)
    emb = target.get_input_embeddings()
    has_emb = "embed_tokens.weight" in state
    if not has_emb and emb.weight.shape[1] != cfg.hidden_size:
        raise ModelLoadError(f"The EAGLE-3 head at {str(path)!r} ships no `embed_tokens.weight`, so it shares the "
                             f"target's embedding, whose width {emb.weight.shape[1]} is not its `hidden_size` "
                             f"{cfg.hidden_size}.")
    head = _build(lambda: Eagle3Head(cfg, embed=None if has_emb else emb), path)
    expected = {k: v.shape for k, v in head.state_dict().items() if has_emb or not k.startswith("embed_tokens")}
    _check_state(state, expected, path, "EAGLE-3", optional={"d2t"})
    d2t = state.get("d2t")
    if d2t is not None:
        ids = torch.arange(cfg.draft_vocab_size) + d2t.long()
        if ids.min() < 0 or ids.max() >= cfg.vocab_size or ids.unique().numel() != ids.numel():
            raise ModelLoadError(f"The EAGLE-3 head's `d2t` in {str(path)!r} does not map the draft vocabulary "
                                 f"one-to-one into the target's {cfg.vocab_size} tokens.")
        state["d2t"] = d2t.long()
    elif cfg.draft_vocab_size != cfg.vocab_size:
        raise ModelLoadError(f"The EAGLE-3 head at {str(path)!r} has a draft vocabulary of {cfg.draft_vocab_size} "
                             f"tokens (< {cfg.vocab_size}) but no `d2t` table to map it to the target's.")
    dtype, device = _shared_placement(target, dtype, device, path)
    with torch.no_grad():
        own = {k: v for k, v in state.items()}
        if "d2t" not in own:
            own["d2t"] = torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
        missing, _ = head.load_state_dict({k: (v.to(dtype) if v.is_floating_point() else v) for k, v in own.items()},
                                          strict=False)
    assert set(missing) <= {"embed_tokens.weight"}, missing
    return head.to(device, dtype).eval()


def _shared_placement(target, dtype, device, path: Path):
    """A head shares the target's embedding (and an MTP head its output head): moving or casting the
    head would move or cast the target's own weights, so it must sit where the target does."""
    tgt = next(target.parameters())
    dtype, device = dtype or tgt.dtype, torch.device(device) if device is not None else tgt.device
    if dtype != tgt.dtype or device != tgt.device:
        raise ModelLoadError(f"The head at {str(path)!r} shares the target's weights, so it runs in the target's "
                             f"dtype and device ({tgt.dtype}, {tgt.device}), not {dtype}, {device}.")
    return dtype, device


def load_mtp(path: str | Path, target, *, device=None, dtype=None):
    """An MTP head directory saved by svt (:mod:`svt.models.mtp`) for ``target``, in eval mode."""
    from svt.models.mtp import ARCHITECTURE, MTPHead, own_state

    path = Path(path)
    cfg = _read_config(path)
    if ARCHITECTURE not in (cfg.get("architectures") or []):
        raise ModelLoadError(f"Expected `architectures` in {str(path / 'config.json')!r} to name {ARCHITECTURE}, "
                             f"but got {cfg.get('architectures')!r}.")
    tc = target.config
    L = int(tc.num_hidden_layers)
    H = _field(cfg, "hidden_size", path)
    heads = _field(cfg, "num_attention_heads", path)
    kv = _field(cfg, "num_key_value_heads", path, default=heads)
    V = _field(cfg, "vocab_size", path)
    layer = cfg.get("mtp_target_layer_id", L)
    common = _common(cfg, path)
    if cfg.get("num_nextn_predict_layers", 1) != 1:
        raise ModelLoadError(f"Expected `num_nextn_predict_layers` = 1 in {str(path / 'config.json')!r}, but got "
                             f"{cfg.get('num_nextn_predict_layers')!r}.")
    if H != tc.hidden_size:
        raise ModelLoadError(f"The MTP head at {str(path)!r} has `hidden_size` = {H}, but the target's hidden size "
                             f"is {tc.hidden_size}.")
    if V != tc.vocab_size:
        raise ModelLoadError(f"The MTP head at {str(path)!r} has `vocab_size` = {V}, but the target's vocabulary "
                             f"is {tc.vocab_size}.")
    _check_heads(cfg, path, H, heads, kv)
    if not isinstance(layer, int) or isinstance(layer, bool):
        raise ModelLoadError(f"Expected `mtp_target_layer_id` in {str(path / 'config.json')!r} to be a layer id, "
                             f"but got {layer!r}.")
    if not 1 <= layer <= L:
        raise ModelLoadError(f"`mtp_target_layer_id` {layer!r} of {str(path)!r} is beyond the target's hidden "
                             f"states: 1..{L} for a {L}-layer target ({L}: its final, normed, hidden state).")
    hc = Eagle3Config(hidden_size=H, intermediate_size=_field(cfg, "intermediate_size", path),
                      num_attention_heads=heads, num_key_value_heads=kv, vocab_size=V, draft_vocab_size=V,
                      target_hidden_size=H, aux_layer_ids=(layer,),
                      **{k: v for k, v in common.items() if k != "norm_before_residual"})
    head = _build(lambda: MTPHead(hc, target.get_input_embeddings(), target.get_output_embeddings()), path)
    state = _read_weights(path)
    _check_state(state, {k: v.shape for k, v in own_state(head).items()}, path, "MTP")
    dtype, device = _shared_placement(target, dtype, device, path)
    head.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    return head.to(device, dtype).eval()


def load_head(path: str | Path, target, *, device=None, dtype=None):
    """An EAGLE-3, MTP, DFlash or DSpark directory, by its ``architectures``."""
    from svt.models.mtp import is_mtp_dir

    if is_block_dir(Path(path)):
        return load_block(path, target, device=device, dtype=dtype)
    if is_mtp_dir(Path(path)):
        return load_mtp(path, target, device=device, dtype=dtype)
    return load_eagle3(path, target, device=device, dtype=dtype)


def is_head_dir(path: str | Path) -> bool:
    from svt.models.eagle3 import is_eagle3_dir
    from svt.models.mtp import is_mtp_dir

    return is_eagle3_dir(Path(path)) or is_mtp_dir(Path(path)) or is_block_dir(Path(path))


def is_block_dir(path: str | Path) -> bool:
    """Whether ``path/config.json`` names a DFlash or DSpark architecture."""
    from svt.models.block import block_kind

    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(cfg, dict) and block_kind(cfg) is not None


def load_block(path: str | Path, target, *, device=None, dtype=None):
    """A DFlash or DSpark directory for ``target``, in eval mode. The layout must fit the target:
    its width (it reads the target's embedding and LM head), vocabulary, layer ids (each below the
    target's layer count), mask token inside the vocabulary, and weights of the config's shapes (the
    target a drafter was trained on is checked by ``load_pair``, which knows the target's path)."""
    from svt.models.block import BlockDrafter, config_from_hf

    path = Path(path)
    raw = _read_config(path)
    where = str(path / "config.json")
    cfg = config_from_hf(raw, where)
    tc = target.config
    L, H, V = int(tc.num_hidden_layers), int(tc.hidden_size), int(tc.vocab_size)
    for name, got, want in (("hidden_size", cfg.hidden_size, H), ("target_hidden_size", cfg.target_hidden_size, H),
                            ("vocab_size", cfg.vocab_size, V)):
        if got != want:
            raise ModelLoadError(f"{where}: `{name}` = {got}, but the target's is {want} (a {cfg.kind} drafter reads "
                                 "the target's hidden states, embedding and LM head).")
    bad = [i for i in cfg.target_layer_ids if not isinstance(i, int) or not 0 <= i < L]
    if bad or not cfg.target_layer_ids:
        raise ModelLoadError(f"{where}: `target_layer_ids` {list(cfg.target_layer_ids)} must be layers of the target "
                             f"(0..{L - 1}; id i reads the output of layer i).")
    if not 0 <= cfg.mask_token_id < V:
        raise ModelLoadError(f"{where}: `mask_token_id` {cfg.mask_token_id} is outside the vocabulary (0..{V - 1}).")
    if cfg.block_size < 2:
        raise ModelLoadError(f"{where}: `block_size` {cfg.block_size} must be at least 2.")
    if cfg.kind == "dspark" and cfg.enable_confidence_head and cfg.confidence_head_with_markov and not cfg.markov_rank:
        raise ModelLoadError(f"{where}: a confidence head `with_markov` needs a Markov head (`markov_rank` > 0).")
    _check_heads(raw, path, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads)
    model = _build(lambda: BlockDrafter(cfg, target.get_input_embeddings(), target.get_output_embeddings()), path)
    state = _read_weights(path)
    own = {k: v.shape for k, v in model.state_dict().items() if not k.startswith(("embed_tokens.", "lm_head."))}
    _check_state(state, own, path, cfg.kind)
    dtype, device = _shared_placement(target, dtype, device, path)
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    return model.to(device, dtype).eval()
