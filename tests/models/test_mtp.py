"""The MTP head (DeepSeek-V3's form): the layer against one written out from vLLM's deepseek_mtp
definition, the cached forward against the unroll, the saved directory and the loader's checks."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from svt.collect.kv_cache import growing_cache
from svt.errors import ModelLoadError
from svt.models.heads import load_head, load_mtp
from svt.models.mtp import MTPHead, is_mtp_dir, save_mtp
from svt.models.train_eagle3 import make_mtp_head, target_view
from tests.models.test_eagle3 import tiny_target


def random_mtp(target, seed=1, scale=0.3) -> MTPHead:
    head = make_mtp_head(target)
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p) * scale)
    return head.eval()


@torch.no_grad()
def test_the_mtp_layer_is_deepseek_v3s(tmp_path):
    """Step 0 against the layer written out from the saved names: enorm(emb(t_{i+1})) and
    hnorm(final hidden of t_i) concatenated in that order, eh_proj, an ordinary pre-norm decoder
    layer whose input is the residual, shared_head.norm and the target's output head."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    target = tiny_target()
    head = random_mtp(target)
    save_mtp(head, tmp_path / "m", dtype=torch.float32)
    w = load_file(tmp_path / "m" / "model.safetensors")
    c = head.cfg
    ids = torch.randint(2, 50, (1, 12))
    taps, _ = target_view(target, ids, (4,))
    eps = c.rms_norm_eps

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    n = ids.shape[1] - 1
    h = taps[:, :n]
    e = target.get_input_embeddings().weight[ids[:, 1:]]
    x = torch.cat([rms(e, w["enorm.weight"]), rms(h, w["hnorm.weight"])], -1) @ w["eh_proj.weight"].T
    a_in = rms(x, w["input_layernorm.weight"])
    nh, nkv, hd = c.num_attention_heads, c.num_key_value_heads, c.head_dim
    q = (a_in @ w["self_attn.q_proj.weight"].T).view(1, n, nh, hd).transpose(1, 2)
    k = (a_in @ w["self_attn.k_proj.weight"].T).view(1, n, nkv, hd).transpose(1, 2)
    v = (a_in @ w["self_attn.v_proj.weight"].T).view(1, n, nkv, hd).transpose(1, 2)
    rot = LlamaRotaryEmbedding(LlamaConfig(hidden_size=c.hidden_size, num_attention_heads=nh, head_dim=hd,
                                           rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta}))
    cos, sin = rot(x, torch.arange(n)[None])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    s = ((q @ k.transpose(-1, -2)) / hd ** 0.5).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    r = (s.softmax(-1) @ v).transpose(1, 2).reshape(1, n, -1) @ w["self_attn.o_proj.weight"].T + x
    m = rms(r, w["post_attention_layernorm.weight"])
    out = (torch.nn.functional.silu(m @ w["mlp.gate_proj.weight"].T) * (m @ w["mlp.up_proj.weight"].T)) \
        @ w["mlp.down_proj.weight"].T + r
    ref = rms(out, w["shared_head.norm.weight"]) @ target.get_output_embeddings().weight.T
    got = load_mtp(tmp_path / "m", target).ttt(ids, taps, 1)[0].logits
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_the_cached_forward_equals_the_unroll():
    target = tiny_target()
    head = random_mtp(target)
    ids = torch.randint(2, 50, (2, 14))
    taps, _ = target_view(target, ids, head.cfg.aux_layer_ids)
    outs = head.ttt(ids, head.fuse(taps), 3)
    i = 7
    cache = growing_cache(head.config)
    mask = torch.ones(2, i + 1, dtype=torch.long)
    o = head(ids[:, 1 : i + 2], taps[:, : i + 1], mask, torch.arange(i + 1)[None].expand(2, -1), cache)
    torch.testing.assert_close(o.logits[:, -1], outs[0].logits[:, i], atol=1e-4, rtol=1e-4)
    for k in (1, 2):
        mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
        o = head(ids[:, i + 1 + k : i + 2 + k], o.hidden[:, -1:], mask, torch.full((2, 1), i + k), cache)
        torch.testing.assert_close(o.logits[:, -1], outs[k].logits[:, i], atol=1e-4, rtol=1e-4)


def test_saved_without_the_shared_tensors_and_loaded_by_its_architecture(tmp_path):
    target = tiny_target()
    head = random_mtp(target)
    save_mtp(head, tmp_path / "m", dtype=torch.float32)
    names = set(load_file(tmp_path / "m" / "model.safetensors"))
    assert {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
            "self_attn.q_proj.weight", "mlp.down_proj.weight"} <= names
    assert not any(n.startswith(("embed_tokens", "shared_head.head")) for n in names)
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["architectures"] == ["SvtLlamaMTP"] and cfg["mtp_target_layer_id"] == 4
    assert is_mtp_dir(tmp_path / "m")
    loaded = load_head(tmp_path / "m", target)
    assert isinstance(loaded, MTPHead) and loaded.kind == "mtp"
    assert loaded.shared_head.head is target.get_output_embeddings()


@pytest.mark.parametrize(("edit_cfg", "edit_state", "message"), [
    (lambda c: c.update(hidden_size=48), None, "hidden_size"),
    (lambda c: c.update(vocab_size=60), None, "vocab_size"),
    (lambda c: c.update(mtp_target_layer_id=5), None, "beyond the target's"),
    (lambda c: c.update(num_nextn_predict_layers=2), None, "num_nextn_predict_layers"),
    (None, lambda s: s.pop("eh_proj.weight"), "missing eh_proj.weight"),
    (None, lambda s: s.update({"eh_proj.weight": torch.zeros(32, 32)}), "`eh_proj.weight`"),
])
def test_an_mtp_head_that_does_not_fit_is_refused_naming_the_field(tmp_path, edit_cfg, edit_state, message):
    target = tiny_target()
    save_mtp(random_mtp(target), tmp_path / "m", dtype=torch.float32)
    if edit_cfg:
        cfg = json.loads((tmp_path / "m" / "config.json").read_text())
        edit_cfg(cfg)
        (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    if edit_state:
        state = load_file(tmp_path / "m" / "model.safetensors")
        edit_state(state)
        save_file(state, tmp_path / "m" / "model.safetensors")
    with pytest.raises(ModelLoadError, match=message.replace("`", ".")):
        load_mtp(tmp_path / "m", target)
