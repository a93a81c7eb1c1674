"""The EAGLE-3 head: training-time test against the cached forward, the published directory form,
and the loader's checks of a head against its target."""

import json
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from svt.collect.kv_cache import growing_cache
from svt.errors import ModelLoadError
from svt.models.eagle3 import Eagle3Config, Eagle3Head, is_eagle3_dir, save_head
from svt.models.heads import default_aux_layers, load_eagle3
from svt.models.train_eagle3 import make_head, target_view


def tiny_target(vocab=50, hidden=32, layers=4, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=128,
                      tie_word_embeddings=True, bos_token_id=0, eos_token_id=1, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def random_head(target, seed=1, scale=0.3):
    head = make_head(target)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if not name.startswith("embed_tokens"):
                p.add_(torch.randn_like(p) * scale)
    return head.eval()


@torch.no_grad()
def test_training_time_test_equals_the_cached_forward_step_by_step():
    """Chain i of ttt(), step k, is what a KV cache holding the step-0 prefix 0..i plus the chain's
    own earlier steps gives: to float rounding, at every chain start and step."""
    target = tiny_target()
    head = random_head(target)
    ids = torch.randint(2, 50, (2, 16))
    taps, _ = target_view(target, ids, head.cfg.aux_layer_ids)
    steps = 4
    outs = head.ttt(ids, head.fuse(taps), steps)
    for i in (0, 5, 10):
        cache = growing_cache(head.config)
        mask = torch.ones(2, i + 1, dtype=torch.long)
        o = head(ids[:, 1 : i + 2], head.fuse(taps[:, : i + 1]), mask, torch.arange(i + 1)[None].expand(2, -1), cache)
        torch.testing.assert_close(o.logits[:, -1], outs[0].logits[:, i], atol=1e-4, rtol=1e-4)
        for k in range(1, steps):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
            o = head(ids[:, i + 1 + k : i + 2 + k], o.hidden[:, -1:], mask, torch.full((2, 1), i + k), cache)
            torch.testing.assert_close(o.logits[:, -1], outs[k].logits[:, i], atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(o.hidden[:, -1], outs[k].hidden[:, i], atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_an_unroll_of_the_later_chains_only_equals_the_whole_unrolls_tail():
    """``ttt(start=s)``: step 0 over every position (the keys the chains attend to), the later
    steps over chains s.. only; every output equals the whole unroll's from s on, and with
    ``logits=False`` the LM head of its normed output gives the same logits."""
    target = tiny_target()
    head = random_head(target)
    ids = torch.randint(2, 50, (2, 16))
    taps, _ = target_view(target, ids, head.cfg.aux_layer_ids)
    whole = head.ttt(ids, head.fuse(taps), 4)
    for start in (1, 6):
        part = head.ttt(ids, head.fuse(taps), 4, logits=False, start=start)
        for w, p in zip(whole, part, strict=True):
            assert p.logits is None and p.hidden.shape[1] == w.hidden.shape[1] - start
            torch.testing.assert_close(p.hidden, w.hidden[:, start:], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(head.logits_of(p.last_hidden), w.logits[:, start:], atol=1e-5, rtol=1e-5)


def test_saved_in_the_published_form(tmp_path):
    target = tiny_target()
    head = random_head(target)
    save_head(head, tmp_path / "h", dtype=torch.float32)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    assert cfg["num_hidden_layers"] == 1 and cfg["draft_vocab_size"] == 50
    names = set(load_file(tmp_path / "h" / "model.safetensors"))
    assert {"fc.weight", "norm.weight", "lm_head.weight", "midlayer.hidden_norm.weight",
            "midlayer.input_layernorm.weight", "midlayer.post_attention_layernorm.weight",
            "midlayer.self_attn.q_proj.weight", "midlayer.mlp.down_proj.weight"} <= names
    assert not any(n.startswith("embed_tokens") for n in names), "a shared embedding is not saved"
    assert "d2t" not in names, "a full-vocabulary head has no d2t (vLLM refuses one)"
    assert load_file(tmp_path / "h" / "model.safetensors")["midlayer.self_attn.q_proj.weight"].shape == (32, 64)
    assert is_eagle3_dir(tmp_path / "h") and not is_eagle3_dir(tmp_path)
    loaded = load_eagle3(tmp_path / "h", target)
    ids = torch.randint(2, 50, (1, 12))
    taps, _ = target_view(target, ids, (1, 2, 3))
    with torch.no_grad():
        a, b = head.ttt(ids, head.fuse(taps), 2), loaded.ttt(ids, loaded.fuse(taps), 2)
    torch.testing.assert_close(a[1].logits, b[1].logits)
    assert loaded.embed_tokens is target.get_input_embeddings()


def reduced_head(target, keep: list[int], full: Eagle3Head | None = None) -> Eagle3Head:
    """A head whose LM head covers only ``keep`` (sorted target ids), with the d2t offsets (from
    ``full``'s weights, a random head by default)."""
    full = full if full is not None else random_head(target)
    cfg = Eagle3Config(**{**full.cfg.__dict__, "draft_vocab_size": len(keep)})
    head = Eagle3Head(cfg, embed=target.get_input_embeddings())
    state = {k: v for k, v in full.state_dict().items() if k not in ("lm_head.weight", "d2t")}
    state["lm_head.weight"] = full.lm_head.weight[keep]
    state["d2t"] = torch.tensor(keep) - torch.arange(len(keep))
    head.load_state_dict(state)
    return head.eval()


@torch.no_grad()
def test_reduced_vocabulary_maps_draft_ids_through_d2t(tmp_path):
    target = tiny_target()
    keep = sorted(torch.randperm(50, generator=torch.Generator().manual_seed(3))[:20].tolist())
    head = reduced_head(target, keep)
    save_head(head, tmp_path / "h", dtype=torch.float32)
    assert "d2t" in load_file(tmp_path / "h" / "model.safetensors")
    loaded = load_eagle3(tmp_path / "h", target)
    ids = torch.randint(2, 50, (1, 10))
    taps, _ = target_view(target, ids, (1, 2, 3))
    logits = loaded.ttt(ids, loaded.fuse(taps), 1)[0].logits[0]
    q = logits.softmax(-1)
    outside = torch.ones(50, dtype=torch.bool)
    outside[keep] = False
    assert q[:, outside].abs().max() == 0, "tokens outside the draft vocabulary have probability 0"
    # draft id j scores target id keep[j]: the draft-vocabulary logits land where d2t says
    draft_logits = loaded.lm_head(loaded.ttt(ids, loaded.fuse(taps), 1)[0].last_hidden[0])
    torch.testing.assert_close(logits[:, keep], draft_logits)


def _write(tmp_path, target, edit_cfg=None, edit_state=None, name="h"):
    head = random_head(target)
    path = tmp_path / name
    save_head(head, path, dtype=torch.float32)
    if edit_cfg:
        cfg = json.loads((path / "config.json").read_text())
        edit_cfg(cfg)
        (path / "config.json").write_text(json.dumps(cfg))
    if edit_state:
        state = load_file(path / "model.safetensors")
        edit_state(state)
        save_file(state, path / "model.safetensors")
    return path


@pytest.mark.parametrize(("edit_cfg", "edit_state", "message"), [
    (lambda c: c.update(target_hidden_size=48), None, "target_hidden_size"),
    (lambda c: c.update(vocab_size=60), None, "vocab_size"),
    (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2, 4]), None, "beyond the target's"),
    (lambda c: c.update(eagle_aux_hidden_state_layer_ids=[1, 2]), None, "three layer ids"),
    (lambda c: c.update(architectures=["LlamaForCausalLM"]), None, "architectures"),
    (lambda c: c.update(hidden_size="32"), None, "hidden_size"),
    (lambda c: c.update(draft_vocab_size=20), lambda s: (s.pop("d2t", None), s.update({"lm_head.weight": s["lm_head.weight"][:20]})),
     "no `d2t`"),
    (None, lambda s: s.pop("fc.weight"), "missing fc.weight"),
    (None, lambda s: s.update({"extra.weight": torch.zeros(2)}), "unexpected extra.weight"),
    (None, lambda s: s.update({"fc.weight": torch.zeros(32, 64)}), "`fc.weight`"),
    (None, lambda s: s.update({"d2t": torch.full((50,), 1)}), "one-to-one"),
    (None, lambda s: s.update({"d2t": torch.zeros(40, dtype=torch.long)}), "`d2t`"),
])
def test_a_head_that_does_not_fit_its_target_is_refused_naming_the_field(tmp_path, edit_cfg, edit_state, message):
    target = tiny_target()
    path = _write(tmp_path, target, edit_cfg, edit_state)
    with pytest.raises(ModelLoadError, match=message.replace("(", r"\(").replace("`", ".")):
        load_eagle3(path, target)


def test_tap_ids_default_to_vllms_with_a_warning(tmp_path):
    target = tiny_target(layers=8)
    head = make_head(target, aux=(2, 4, 5))
    save_head(head, tmp_path / "h", dtype=torch.float32)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    del cfg["eagle_aux_hidden_state_layer_ids"]
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    with pytest.warns(UserWarning, match=r"vLLM's default \[2, 4, 5\]"):
        loaded = load_eagle3(tmp_path / "h", target)
    assert loaded.cfg.aux_layer_ids == default_aux_layers(8) == (2, 4, 5)
    # in eagle_config (the form some exporters write) it is read without a warning
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 3, 6]}
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_eagle3(tmp_path / "h", target).cfg.aux_layer_ids == (1, 3, 6)


def test_vllms_default_taps_are_broken_on_a_four_layer_target():
    assert default_aux_layers(4) == (2, 2, 1)


def test_an_embedding_shipped_with_the_head_is_its_own(tmp_path):
    target = tiny_target()
    head = random_head(target)
    save_head(head, tmp_path / "h", dtype=torch.float32)
    state = load_file(tmp_path / "h" / "model.safetensors")
    state["embed_tokens.weight"] = torch.randn(50, 32)
    save_file(state, tmp_path / "h" / "model.safetensors")
    loaded = load_eagle3(tmp_path / "h", target)
    assert loaded.embed_tokens is not target.get_input_embeddings()
    torch.testing.assert_close(loaded.embed_tokens.weight, state["embed_tokens.weight"])


def _reference_step0(state: dict, cfg: Eagle3Config, emb: torch.Tensor, taps: torch.Tensor, ids: torch.Tensor):
    """The EAGLE-3 layer as vLLM's ``llama_eagle3`` defines it, written out from the published
    weight names with transformers' Llama rotary embedding: the logits of every position of one
    sequence at step 0 (full causal attention, no cache): position i predicts t_{i+2}."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w

    # vLLM feeds the drafter token t_{i+1} with the target's hidden states of t_i at position i
    n = ids.shape[1] - 1
    g = taps[:, :n] @ state["fc.weight"].T  # [1, n, H]
    e = rms(emb[ids[:, 1:]], state["midlayer.input_layernorm.weight"])
    h = rms(g, state["midlayer.hidden_norm.weight"])
    x = torch.cat([e, h], -1)
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q = (x @ state["midlayer.self_attn.q_proj.weight"].T).view(1, n, nh, hd).transpose(1, 2)
    k = (x @ state["midlayer.self_attn.k_proj.weight"].T).view(1, n, nkv, hd).transpose(1, 2)
    v = (x @ state["midlayer.self_attn.v_proj.weight"].T).view(1, n, nkv, hd).transpose(1, 2)
    rope = {"rope_type": "default", **(cfg.rope_scaling or {}), "rope_theta": cfg.rope_theta}
    rot = LlamaRotaryEmbedding(LlamaConfig(hidden_size=cfg.hidden_size, num_attention_heads=nh, head_dim=hd,
                                           max_position_embeddings=4096, rope_parameters=rope))
    cos, sin = rot(x, torch.arange(n)[None])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    s = (q @ k.transpose(-1, -2)) / hd ** 0.5
    s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    a = (s.softmax(-1) @ v).transpose(1, 2).reshape(1, n, nh * hd) @ state["midlayer.self_attn.o_proj.weight"].T
    r = a + g  # norm_before_residual false: the residual is the fused feature itself
    m = rms(r, state["midlayer.post_attention_layernorm.weight"])
    mlp = (torch.nn.functional.silu(m @ state["midlayer.mlp.gate_proj.weight"].T) * (m @ state["midlayer.mlp.up_proj.weight"].T)) \
        @ state["midlayer.mlp.down_proj.weight"].T
    return rms(mlp + r, state["norm.weight"]) @ state["lm_head.weight"].T


@torch.no_grad()
def test_the_head_computes_the_published_layer(tmp_path):
    """Against the layer written out from the published weight names (an independent reference):
    the concatenation order, the two input norms, the fused feature as the residual, the rotary
    embedding, the post-attention norm and MLP, the final norm and LM head."""
    target = tiny_target()
    head = random_head(target)
    save_head(head, tmp_path / "h", dtype=torch.float32)
    state = load_file(tmp_path / "h" / "model.safetensors")
    ids = torch.randint(2, 50, (1, 14))
    taps, _ = target_view(target, ids, (1, 2, 3))
    ref = _reference_step0(state, head.cfg, target.get_input_embeddings().weight, taps, ids)
    got = load_eagle3(tmp_path / "h", target).ttt(ids, head.fuse(taps), 1)[0].logits
    torch.testing.assert_close(got[0], ref[0], atol=1e-4, rtol=1e-4)


def test_the_training_loss_is_the_weighted_soft_cross_entropy_against_the_next_positions():
    """``ttt_loss`` against a loop over chains and steps: step k of chain i is scored against the
    target's distribution at position i + 1 + k, weighted 0.8 ** k."""
    from svt.models.train_eagle3 import ttt_loss

    target = tiny_target()
    head = random_head(target)
    ids = torch.randint(2, 50, (2, 9))
    with torch.no_grad():
        taps, logits = target_view(target, ids, (1, 2, 3))
        loss, per_step, _ = ttt_loss(head, ids, taps, logits, 3, 0.8)
        outs = head.ttt(ids, head.fuse(taps), 3)
    n = ids.shape[1]
    total, weights = 0.0, 0.0
    for k in range(3):
        ces = [-(logits[b, i + 1 + k].softmax(-1) * outs[k].logits[b, i].log_softmax(-1)).sum()
               for b in range(2) for i in range(n - 1) if i + 1 + k < n]
        ce = torch.stack(ces).mean()
        assert abs(float(ce) - per_step[k]) < 1e-4
        total, weights = total + 0.8 ** k * ce, weights + 0.8 ** k
    torch.testing.assert_close(loss, total / weights)


@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_head_training_learns_and_an_interrupted_stage_resumes_to_the_same_head(tmp_path, monkeypatch, kind):
    from svt.models import train_eagle3 as tr

    target = tiny_target()
    stream = target.generate(torch.randint(2, 50, (8, 4)), max_new_tokens=60, do_sample=True, pad_token_id=0,
                             eos_token_id=None, attention_mask=torch.ones(8, 4, dtype=torch.long)).reshape(-1).numpy()
    held = torch.from_numpy(stream[:64].reshape(2, 32).copy())
    cfg = tr.HeadTraining(tokens=2 * 32 * 40, batch=2, context=32, ttt_steps=3, lr=1e-2, warmup=2,
                          generated_sequences=4, prompt_len=8, eval_every=20, checkpoint_minutes=0)
    head, figures = tr.train_head(target, stream, held, cfg, tmp_path / "a", eos=1, target_id="t", kind=kind)
    first, last = figures["curve"][0], figures["curve"][-1]
    assert last["held_out_ce_by_step"][0] < first["held_out_ce_by_step"][0]
    assert (tmp_path / "continuations-t-s0-n4-p8-c32.npy").is_file()

    real_lr = tr.cosine_lr

    def dies_at_25(step, n, c):
        if step == 25:
            raise KeyboardInterrupt
        return real_lr(step, n, c)

    monkeypatch.setattr(tr, "cosine_lr", dies_at_25)
    with pytest.raises(KeyboardInterrupt):
        tr.train_head(target, stream, held, cfg, tmp_path / "b", eos=1, target_id="t", kind=kind)
    monkeypatch.setattr(tr, "cosine_lr", real_lr)
    resumed, _ = tr.train_head(target, stream, held, cfg, tmp_path / "b", eos=1, target_id="t", kind=kind)
    for (n, a), (_, b) in zip(head.state_dict().items(), resumed.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, msg=n)
    with pytest.raises(SystemExit, match="another head-training config or target"):
        tr.train_head(target, stream, held, cfg, tmp_path / "b", eos=1, target_id="another", kind=kind)


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}


@torch.no_grad()
def test_a_llama3_scaled_head_rotates_as_transformers_does(tmp_path):
    """Published heads for Llama 3.1 targets carry Llama 3's rope scaling: read from the config and
    applied (the written-out layer uses transformers' own rotary embedding for that config)."""
    target = tiny_target()
    head = random_head(target)
    save_head(head, tmp_path / "h", dtype=torch.float32)
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    cfg["rope_scaling"] = LLAMA3_ROPE
    (tmp_path / "h" / "config.json").write_text(json.dumps(cfg))
    loaded = load_eagle3(tmp_path / "h", target)
    assert loaded.cfg.rope_scaling["rope_type"] == "llama3"
    ids = torch.randint(2, 50, (1, 14))
    taps, _ = target_view(target, ids, (1, 2, 3))
    state = load_file(tmp_path / "h" / "model.safetensors")
    ref = _reference_step0(state, loaded.cfg, target.get_input_embeddings().weight, taps, ids)
    got = loaded.ttt(ids, loaded.fuse(taps), 1)[0].logits
    torch.testing.assert_close(got[0], ref[0], atol=1e-4, rtol=1e-4)
    unscaled = load_eagle3(_write(tmp_path, target, name="plain"), target)
    assert not torch.allclose(unscaled.inv_freq, loaded.inv_freq)


def test_a_rope_whose_frequencies_follow_the_length_is_refused(tmp_path):
    target = tiny_target()
    path = _write(tmp_path, target, edit_cfg=lambda c: c.update(rope_scaling={"rope_type": "dynamic", "factor": 2.0}))
    with pytest.raises(ModelLoadError, match="rope type 'dynamic'"):
        load_eagle3(path, target)


def test_a_head_sharing_the_targets_embedding_stays_in_the_targets_dtype(tmp_path):
    target = tiny_target()
    path = _write(tmp_path, target)
    with pytest.raises(ModelLoadError, match="shares the target's weights"):
        load_eagle3(path, target, dtype=torch.bfloat16)
    assert target.get_input_embeddings().weight.dtype == torch.float32


@pytest.mark.parametrize(("edit_cfg", "edit_state", "message"), [
    (lambda c: c.update(rms_norm_eps="1e-6"), None, "rms_norm_eps"),
    (lambda c: c.update(rms_norm_eps=-1), None, "rms_norm_eps"),
    (lambda c: c.update(rope_theta=-5), None, "rope_theta"),
    (lambda c: c.update(max_position_embeddings="2048"), None, "max_position_embeddings"),
    (lambda c: c.update(norm_before_residual="false"), None, "norm_before_residual"),
    (lambda c: c.update(hidden_act="gelu"), None, "hidden_act"),
    (lambda c: (c.pop("rope_theta"), c.update(rope_parameters=[1, 2])), None, "rope_parameters"),
    (lambda c: c.update(rope_scaling={"rope_type": "linear"}), None, "rope_scaling"),
    (None, lambda s: s["fc.weight"].__setitem__((0, 0), float("nan")), "NaN"),
    (None, lambda s: s.update({"norm.weight": s["norm.weight"].long()}), "floats"),
])
def test_config_values_of_the_wrong_kind_are_one_message(tmp_path, edit_cfg, edit_state, message):
    """Found by a hostile probe: each of these was a traceback or a silently different head."""
    target = tiny_target()
    path = _write(tmp_path, target, edit_cfg, edit_state)
    with pytest.raises(ModelLoadError, match=message):
        load_eagle3(path, target)


@pytest.mark.parametrize("config", [[1, 2, 3], None, "x", {"architectures": 5}])
def test_a_config_that_is_no_object_is_not_taken_for_a_head(tmp_path, config):
    from svt.models.heads import is_head_dir

    (tmp_path / "config.json").write_text(json.dumps(config))
    assert not is_head_dir(tmp_path) and not is_eagle3_dir(tmp_path)


def test_a_head_given_as_the_target_is_refused_naming_the_swap(tmp_path, models_dir):
    from svt.models import load_pair

    with pytest.raises(ModelLoadError, match="is a hidden-state head"):
        load_pair(models_dir / "eagle3", models_dir / "target", device="cpu")


def test_a_head_warm_started_from_another_starts_from_its_weights_not_the_targets_embedding(tmp_path):
    """``--init-from``: the new head begins at the old head's own weights; the shared embedding
    stays the (new) target's; the work folder records where it started."""
    from svt.models import train_eagle3 as tr

    target = tiny_target()
    old = random_head(tiny_target(seed=5))  # trained on another target: another embedding
    stream = np.random.default_rng(0).integers(2, 50, size=2_000)
    held = torch.from_numpy(stream[:64].reshape(2, 32).copy())
    cfg = tr.HeadTraining(tokens=2 * 32, batch=2, context=32, ttt_steps=2, lr=0.0, warmup=1, generated_share=0.0,
                          eval_every=1, checkpoint_minutes=0)
    head, _ = tr.train_head(target, stream, held, cfg, tmp_path / "w", eos=1, target_id="t",
                            init=("old", tr.trained_part(old)))
    for name, t in tr.trained_part(old).items():
        torch.testing.assert_close(head.state_dict()[name], t, msg=name)
    assert head.embed_tokens is target.get_input_embeddings()
    assert json.loads((tmp_path / "w" / "config.json").read_text())["init_from"] == "old"
    with pytest.raises(SystemExit, match="not a eagle3 head of this shape"):
        tr.train_head(target, stream, held, cfg, tmp_path / "x", eos=1, target_id="t",
                      init=("bad", {"fc.weight": torch.zeros(3, 3)}))
